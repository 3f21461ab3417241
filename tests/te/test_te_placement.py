"""The flush net's rule (te/placement.py) on real tensors: device type, zero-byte storage under a
shape, meta, empty swaps on the device (a reshard's, kept), and the parameters of sharding wrappers,
which never count as offloaded; the wrappers' marks handed down from integrations/flush.py as the
net's arming does.

torch here has no GPU: a plain CPU tensor is off the "cuda" device, which is what the real rule
answers for an offload to the CPU; with `DEVICE_TYPE = "cpu"` (the seam) the CPU is the device, so
a CPU tensor holding bytes is on it and a zero-byte one is not.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from support.placement import left_device, offloaded

from te_offload_shim.integrations import flush
from te_offload_shim.te import placement


@pytest.fixture(autouse=True)
def marks_handed_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("_sharded_types", "_sharded_marks", "_offload_marks"):
        monkeypatch.setattr(placement, name, getattr(placement, name))  # put back after the test
    placement.know(flush.SHARDED_TYPES, flush.SHARDED_MARKS, flush.OFFLOAD_MARKS)
    yield


@pytest.fixture
def cpu_is_the_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(placement, "DEVICE_TYPE", "cpu")
    yield


def _resized_away(n: int = 4) -> torch.Tensor:
    """A tensor of `n` elements whose storage was resized to zero bytes (megatron-core's buffer offload)."""
    t = torch.ones(n)
    t.untyped_storage().resize_(0)
    return t


def _layer(*params: torch.Tensor) -> torch.nn.Module:
    layer = torch.nn.Module()
    for i, p in enumerate(params):
        layer.register_parameter(f"w{i}", torch.nn.Parameter(p, requires_grad=False))
    return layer


def test_off_the_device_type_is_off_on_the_real_rule() -> None:
    assert placement.DEVICE_TYPE == "cuda"
    assert not placement.on_device(torch.ones(4)), "a CPU tensor is not on CUDA"
    assert not placement.on_device(torch.ones(4, device="meta"))
    assert left_device(_layer(torch.ones(4), torch.ones(2, device="meta")))


def test_a_tensor_holding_bytes_on_the_device_is_on(cpu_is_the_device: None) -> None:
    assert placement.on_device(torch.ones(4))
    assert placement.on_device(torch.nn.Parameter(torch.ones(4)))
    assert not placement.on_device(torch.ones(4, device="meta")), "meta is never the device"


def test_a_zero_byte_storage_is_off(cpu_is_the_device: None) -> None:
    resized = torch.ones(8)
    view = resized[2:6]
    resized.untyped_storage().resize_(0)  # megatron-core's buffer offload, verl's storage().resize_(0)
    assert not placement.on_device(resized) and not placement.on_device(view)


def test_an_empty_tensor_on_the_device_is_kept_unless_an_offload_marked_it(cpu_is_the_device: None) -> None:
    """`param.data = torch.empty(0, device=<the device>)` is DeepSpeed ZeRO-3's free after each use, and
    any unknown wrapper's reshard that frees the same way: not known to be an offload, so on. SkyRL's
    LoRA offload swaps the same, and marks the parameter with the CPU copy it keeps: off."""
    swapped = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    assert placement.on_device(swapped) and not left_device(_layer(torch.empty(0)))
    swapped._offload_cpu_data = torch.ones(4)  # type: ignore[attr-defined]
    assert not placement.on_device(swapped)
    assert not placement.on_device(torch.empty(0, device="meta")), "off the device type: off, empty or not"


def test_a_layer_has_left_only_when_every_own_weight_has(cpu_is_the_device: None) -> None:
    gone = _resized_away()
    assert left_device(_layer(gone, _resized_away()))
    assert not left_device(_layer(gone, torch.ones(3))), "half on the device: on"
    assert not left_device(_layer(torch.ones(3), gone)), "the first weight on: on at one look"
    assert not left_device(torch.nn.Module()), "no weights: nothing says it was offloaded"
    parent = torch.nn.Module()
    parent.child = _layer(gone)
    assert not left_device(parent), "a layer's own parameters only, not its children's"


def test_parameters_of_a_sharding_wrapper_never_count_as_offloaded(cpu_is_the_device: None) -> None:
    """FSDP1's _fsdp_flattened, Megatron-FSDP's __fsdp_param__, DeepSpeed's ds_id (0 for the first
    parameter: the mark's presence counts, not its value), on a full-shaped zero-byte weight (a
    wrapper that resizes its flat buffer away under views looks like a buffer offload)."""
    assert flush.SHARDED_MARKS == ("_fsdp_flattened", "__fsdp_param__", "ds_id")
    for mark in flush.SHARDED_MARKS:
        layer = _layer(_resized_away())
        setattr(next(layer.parameters()), mark, 0)
        assert not left_device(layer), mark
        assert left_device(_layer(_resized_away())), "the same layer without the mark"


def test_a_quantized_weight_is_read_on_the_device_type_asked() -> None:
    """TE's quantized parameter (a tensor subclass keeping its bytes in `_data`), asked about the CPU
    while the module's device type is CUDA: its inner data is read with the same flag."""

    class Quantized(torch.Tensor):
        pass

    q = torch.Tensor._make_subclass(Quantized, torch.ones(4))
    q._data = torch.ones(4)  # type: ignore[attr-defined]
    assert placement.on_device(q, "is_cpu"), "its data holds bytes on the CPU"
    q._data = _resized_away()  # type: ignore[attr-defined]
    assert not placement.on_device(q, "is_cpu")


def test_an_unreadable_tensor_counts_as_on(cpu_is_the_device: None) -> None:
    class Odd:
        is_cpu = True

        def untyped_storage(self) -> object:
            raise RuntimeError("no storage")

    assert placement.on_device(Odd())


def test_the_flush_loop_finds_exactly_the_offloaded_layers(cpu_is_the_device: None) -> None:
    gone = _resized_away()
    on, off, half, bare = _layer(torch.ones(2)), _layer(gone, gone), _layer(gone, torch.ones(2)), torch.nn.Module()
    first_none = _layer(gone)
    first_none.register_parameter("a_none_first", None)
    first_none._parameters = {"a_none_first": None, **first_none._parameters}
    assert offloaded([on, off, half, bare, first_none]) == [off, first_none]


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
        assert not left_device(sharded) and offloaded([sharded]) == []

        inner = torch.nn.Linear(4, 4)
        FullyShardedDataParallel(inner, device_id=torch.device("cpu"), use_orig_params=True)
        marked = [p for p in inner.parameters() if getattr(p, "_fsdp_flattened", False)]
        assert marked and all(not p.is_cuda for p in marked), "FSDP1 marks its originals, here on the CPU"
        assert not left_device(inner) and offloaded([inner]) == []
    finally:
        dist.destroy_process_group()
    plain = _layer(torch.ones(4, 4), torch.ones(4))
    assert left_device(plain) and offloaded([plain]) == [plain], "plain CPU weights: off"
