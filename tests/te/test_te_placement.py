"""The flush net's rule (te/placement.py) on real tensors: device type, zero-byte storage, meta, and
the parameters of sharding wrappers, which never count as offloaded.

torch here has no GPU: a plain CPU tensor is off the "cuda" device, which is what the real rule
answers for an offload to the CPU; with `DEVICE_TYPE = "cpu"` (the seam) the CPU is the device, so
a CPU tensor holding bytes is on it and a zero-byte one is not.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from te_offload_shim.te import placement


@pytest.fixture
def cpu_is_the_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(placement, "DEVICE_TYPE", "cpu")
    yield


def _layer(*params: torch.Tensor) -> torch.nn.Module:
    layer = torch.nn.Module()
    for i, p in enumerate(params):
        layer.register_parameter(f"w{i}", torch.nn.Parameter(p, requires_grad=False))
    return layer


def test_off_the_device_type_is_off_on_the_real_rule() -> None:
    assert placement.DEVICE_TYPE == "cuda"
    assert not placement.on_device(torch.ones(4)), "a CPU tensor is not on CUDA"
    assert not placement.on_device(torch.ones(4, device="meta"))
    assert placement.left_device(_layer(torch.ones(4), torch.ones(2, device="meta")))


def test_a_tensor_holding_bytes_on_the_device_is_on(cpu_is_the_device: None) -> None:
    assert placement.on_device(torch.ones(4))
    assert placement.on_device(torch.nn.Parameter(torch.ones(4)))
    assert not placement.on_device(torch.ones(4, device="meta")), "meta is never the device"


def test_a_zero_byte_storage_is_off(cpu_is_the_device: None) -> None:
    resized = torch.ones(8)
    view = resized[2:6]
    resized.untyped_storage().resize_(0)  # megatron-core's buffer offload, verl's storage().resize_(0)
    assert not placement.on_device(resized) and not placement.on_device(view)
    assert not placement.on_device(torch.empty(0)), "AReaL's / SkyRL's param.data = torch.empty(0)"


def test_a_layer_has_left_only_when_every_own_weight_has(cpu_is_the_device: None) -> None:
    gone = torch.empty(0)
    assert placement.left_device(_layer(gone, torch.empty(0)))
    assert not placement.left_device(_layer(gone, torch.ones(3))), "half on the device: on"
    assert not placement.left_device(_layer(torch.ones(3), gone)), "the first weight on: on at one look"
    assert not placement.left_device(torch.nn.Module()), "no weights: nothing says it was offloaded"
    parent = torch.nn.Module()
    parent.child = _layer(gone)
    assert not placement.left_device(parent), "a layer's own parameters only, not its children's"


def test_parameters_of_a_sharding_wrapper_never_count_as_offloaded(cpu_is_the_device: None) -> None:
    for mark in placement.SHARDING_MARKS:  # FSDP1's _fsdp_flattened, Megatron-FSDP's __fsdp_param__
        layer = _layer(torch.empty(0))
        setattr(next(layer.parameters()), mark, True)
        assert not placement.left_device(layer), mark
        assert placement.left_device(_layer(torch.empty(0))), "the same layer without the mark"


def test_an_unreadable_tensor_counts_as_on(cpu_is_the_device: None) -> None:
    class Odd:
        is_cpu = True

        def untyped_storage(self) -> object:
            raise RuntimeError("no storage")

    assert placement.on_device(Odd())


def test_the_flush_loop_finds_exactly_the_offloaded_layers(cpu_is_the_device: None) -> None:
    gone = torch.empty(0)
    on, off, half, bare = _layer(torch.ones(2)), _layer(gone, gone), _layer(gone, torch.ones(2)), torch.nn.Module()
    first_none = _layer(gone)
    first_none.register_parameter("a_none_first", None)
    first_none._parameters = {"a_none_first": None, **first_none._parameters}
    assert placement.offloaded([on, off, half, bare, first_none]) == [off, first_none]


@pytest.mark.subprocess(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29541", "RANK": "0"})
def test_sharded_parameters_on_the_cpu_never_count_as_offloaded() -> None:
    """The real rule (device "cuda"; this torch has none, so every tensor here is off it): a sharding
    wrapper's parameters on the CPU, as FSDP2's and FSDP1's CPU offloads leave them, are no offload.
    FSDP2's: a real DTensor on the CPU (gloo, world size 1). FSDP1's: the original parameters its real
    wrapper keeps in the layer (`use_orig_params`), carrying the `_fsdp_flattened` mark it sets. The same layers with
    plain tensors in their place have left the device: only the wrapper's mark keeps them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    assert placement.DEVICE_TYPE == "cuda"
    dist.init_process_group("gloo", world_size=1, rank=0)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Module()
        sharded.register_parameter("weight", torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])))
        sharded.register_parameter("bias", torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Shard(0)])))
        assert type(sharded.weight) is DTensor and not sharded.weight.is_cuda
        assert not placement.left_device(sharded) and placement.offloaded([sharded]) == []

        inner = torch.nn.Linear(4, 4)
        FullyShardedDataParallel(inner, device_id=torch.device("cpu"), use_orig_params=True)
        marked = [p for p in inner.parameters() if getattr(p, "_fsdp_flattened", False)]
        assert marked and all(not p.is_cuda for p in marked), "FSDP1 marks its originals, here on the CPU"
        assert not placement.left_device(inner) and placement.offloaded([inner]) == []
    finally:
        dist.destroy_process_group()
    plain = _layer(torch.ones(4, 4), torch.ones(4))
    assert placement.left_device(plain) and placement.offloaded([plain]) == [plain], "plain CPU weights: off"
