"""The twin's host: what an offload moved to the host answers as a host tensor does on a GPU
(harness/te_twin/host.py), and nothing else does.

Each test runs in a fresh interpreter with TE 2.20.2 on the twin (loading it changes torch
process-wide). The net's side of it, on TE's own modules in a real Megatron GPT, is
tests/twin/test_twin_net.py::test_offloads_that_move_each_weight_to_the_host_are_cleared_at_their_flush_bit_identical_to_the_net_off.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

RELEASE = "2.20.2"
twin = pytest.mark.subprocess(timeout=180)


def _te() -> Any:
    from harness import te_twin

    return te_twin.load(RELEASE)


@twin
def test_what_an_offload_moves_to_the_host_answers_as_a_host_tensor_and_a_reload_brings_it_back() -> None:
    """Inside the scope: a factory given the CPU or no device, the legacy constructor, `.to("cpu")`
    and `.cpu()` (a copy: the source stays on the device), and a parameter whose data is set to one
    of them, are host tensors; a factory given CUDA is not. Outside it: the twin's own answers (every
    CPU tensor is the device's), but a host tensor's `.data` and `.detach()` stay on the host and its
    `.to("cuda")` / `.cuda()` is a device copy; `param.data = ` that copy brings the parameter back."""
    _te()
    import torch

    from harness.te_twin import host

    outside = [torch.empty(0, device="cpu"), torch.Tensor(), torch.zeros(2).to("cpu"), torch.ones(2).cpu()]
    assert all(t.is_cuda for t in outside), "outside an offload every CPU tensor is the twin's device"

    weight = torch.nn.Parameter(torch.arange(4.0))
    source = weight.data
    with host.offloading():
        made = [
            torch.empty(0, device="cpu"),
            torch.empty(0),
            torch.Tensor(),
            torch.zeros(2, device=torch.device("cpu")),
        ]
        on_device = [torch.empty(0, device="cuda"), torch.empty(0, device=0), torch.Tensor(2, device="cpu").cuda()]
        copied = source.to("cpu", non_blocking=True)
        also = source.cpu()
        weight.data = weight.data.to("cpu")
        kept = torch.nn.Parameter(torch.ones(3))
        tied = torch.nn.Parameter(torch.ones(3))
        tied.data = kept.data  # moved nowhere
    assert "__new__" not in vars(torch.Tensor), "the legacy constructor is torch's own again"
    assert not any(t.is_cuda for t in made), made
    assert all(t.is_cuda for t in on_device)
    assert not copied.is_cuda and not also.is_cuda and copied is not source and also is not source
    assert source.is_cuda, "the source of a copy to the host stays on the device"
    assert not weight.is_cuda and not weight.data.is_cuda and not weight.detach().is_cuda
    assert kept.is_cuda and tied.is_cuda
    assert torch.equal(weight, torch.arange(4.0))

    back = weight.data.to("cuda", non_blocking=True)
    assert back.is_cuda and not weight.is_cuda, "a device copy; the host tensor stays where it is"
    weight.data = back
    assert weight.is_cuda and torch.equal(weight, torch.arange(4.0))
    on_host = made[0]
    assert on_host.cuda().is_cuda and not on_host.is_cuda and on_host.cuda() is not on_host


@twin
def test_a_host_tensor_that_died_leaves_no_stale_id_for_tes_forward() -> None:
    """Host tensors are kept by `id` and dropped when they die: the tensors made after them at the
    same addresses (a new layer's input among them) are the device's, and TE's `prepare_forward`,
    which refuses an input that is not CUDA, runs on them."""
    te = _te()
    import torch

    from harness.te_twin import host

    with host.offloading():
        dead = [torch.empty(16, device="cpu") for _ in range(200)]
    ids = {id(t) for t in dead}
    assert not any(t.is_cuda for t in dead)
    del dead
    gc.collect()

    layer = te.Linear(16, 16, params_dtype=torch.float32)
    made = [torch.randn(8, 16) for _ in range(400)]
    reused = [t for t in made if id(t) in ids]
    assert reused, "the test needs a tensor at a dead host tensor's address"
    assert all(t.is_cuda for t in made), [i for i, t in enumerate(made) if not t.is_cuda]
    for x in reused[:4]:
        assert layer(x).shape == (8, 16)
    assert not host.watching(), "no host tensor is left"
