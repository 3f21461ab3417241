"""Whether a TE layer's weights have left the device: the flush net's rule for "this layer was offloaded".

A layer has left the device when it has at least one parameter of its own and every one of them
has been offloaded. A parameter is offloaded when (a) it is off the device type (`DEVICE_TYPE`,
read through the tensor's own `is_<type>` flag): moved to the CPU or to `meta` (verl's and ROLL's
`.to("cpu")`, AReaL's and ChatLearn's `param.data = torch.empty(0, device="cpu")`); or (b) it is
on the device type with its shape and a storage resized to zero bytes (megatron-core's buffer
`offload_to_cpu`, verl's, SkyRL's, RLinf's and Relax's `storage().resize_(0)` under the views).
A layer with one weight still on the device is on, and is never touched.

A sharding wrapper frees weight storage between microbatches too: a reshard, not an offload, and
a cache cleared then changes the next microbatch's numbers (TE reuses it when
`is_first_microbatch=False`). So the rule errs toward clearing nothing mid-step:
- a parameter on the device type with no elements (its data swapped for an empty tensor there) is
  not known to be offloaded, so it is on. That is DeepSpeed ZeRO-3's `free_param` after each use
  (`torch.empty(0, dtype, device=param.device)`), FSDP1's views of the shards a rank does not
  hold, and whatever an unknown wrapper does the same way. The one offload of this shape that the
  net still clears is one that marks the parameter as it swaps (`know`'s `offload_marks`: SkyRL's
  LoRA offload keeps the CPU copy in `param._offload_cpu_data`);
- a parameter that carries a sharding wrapper's mark (`know`'s `sharded_marks`, `sharded_types`)
  is never offloaded, wherever its data is: on the device, on the CPU after a wrapper's own CPU
  offload, or freed by a reshard (a wrapper that resizes its flat buffer under full-shaped views
  looks like (b) above, and only its mark tells);
- a tensor subclass other than TE's quantized tensors (DTensor) is on; TE's quantized tensor is off
  only when every inner data tensor TE keeps it in is offloaded by (a) or (b); one that cannot be
  read is on.
Not knowing means "on": the net then clears nothing. What the wrappers mark is integrations'
knowledge (integrations/flush.py), handed down by `know`: this module knows TE only.

`DEVICE_TYPE` is the one seam: a CPU stand-in for the device answers `is_cuda` for its CPU tensors
(harness/te_twin does), and a test of the rule on plain CPU tensors sets it to "cpu".
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, Protocol

from te_offload_shim._reload import kept

DEVICE_TYPE = "cuda"  # the device type whose tensors count as "on the device"

# Handed down by `know` (integrations/flush.py): the type names and instance attributes by which a
# sharding wrapper marks the parameters it manages, and the attributes an offload leaves on a
# parameter it swaps for an empty tensor on the device. Told once, when the net arms, and read at
# every flush: kept by a reload of this module (`kept`), which would otherwise take a reshard for an
# offload.
_sharded_types: frozenset[str] = kept(globals(), "_sharded_types", frozenset)
_sharded_marks: tuple[str, ...] = kept(globals(), "_sharded_marks", tuple)
_offload_marks: tuple[str, ...] = kept(globals(), "_offload_marks", tuple)
# Where a TE quantized parameter keeps its bytes (te/sizes.py has the full list, for caches).
QUANTIZED_DATA = ("_data", "_rowwise_data", "_columnwise_data")


def flag() -> str:
    """The tensor attribute that says "of the device type" (`is_cuda`), read once per flush."""
    return f"is_{DEVICE_TYPE}"


def know(sharded_types: Iterable[str], sharded_marks: Iterable[str], offload_marks: Iterable[str]) -> None:
    """Take the sharding wrappers' and the offloads' marks (see above) from the layer that knows them."""
    global _sharded_types, _sharded_marks, _offload_marks
    _sharded_types, _sharded_marks = frozenset(sharded_types), tuple(sharded_marks)
    _offload_marks = tuple(offload_marks)


def on_device(tensor: Any, is_device: str | None = None) -> bool:
    """Whether `tensor` is not known to be offloaded (see above). Cheap for a plain tensor holding
    bytes (one flag, one storage size): the net asks it of one parameter per TE layer at every flush."""
    is_device = is_device or flag()
    try:
        if not getattr(tensor, is_device):
            return False
        if type(tensor) not in _plain_types():
            return _subclass_on_device(tensor, is_device)
        return _kept(tensor)
    except Exception:
        return True  # not knowing is "on": the layer is left alone


def _kept(tensor: Any) -> bool:
    """A tensor of the device type: on unless its storage was resized away under its shape, or an
    offload that swapped it for an empty one marked it."""
    nbytes = tensor.untyped_storage().nbytes()
    if nbytes or tensor.numel():
        return nbytes > 0
    d = object.__getattribute__(tensor, "__dict__")
    return not any(mark in d for mark in _offload_marks)


def _decide(layer: Any, is_device: str) -> tuple[bool, str | None, str | None]:
    """(whether every one of `layer`'s own parameters (at least one) has left the device, and none is
    managed by a sharding wrapper (wherever that wrapper's data is: on the device, on the CPU after a
    CPU offload of FSDP1 or FSDP2, or freed by a reshard); the name of an own parameter found on the
    device holding bytes, or None; the name of one on the device holding none where nothing else
    decides: the rule cannot tell a reshard from an offload that marked nothing, and keeps the layer
    undecided, which the net counts and names)."""
    try:
        params = object.__getattribute__(layer, "__dict__").get("_parameters") or {}
        found = False  # no parameters: nothing says it was offloaded
        empty = None
        for name, p in list(params.items()):
            if p is None:
                continue
            if _sharded(p):
                return False, None, None  # a sharding wrapper's weight: never an offload, on or off the device
            if on_device(p, is_device):
                if not _holds_nothing(p):
                    return False, name, None
                empty = empty or name
                continue
            found = True
        return found and empty is None, None, empty
    except Exception:
        return False, None, None


def _holds_nothing(tensor: Any) -> bool:
    """Whether a tensor the rule counts as on the device holds no bytes there (its data, or each of
    a TE quantized tensor's inner data tensors, swapped for an empty one)."""
    if type(tensor) in _plain_types():
        return not tensor.untyped_storage().nbytes()
    d = object.__getattribute__(tensor, "__dict__")
    inner = [d[name] for name in QUANTIZED_DATA if d.get(name) is not None]
    return bool(inner) and not any(t.untyped_storage().nbytes() for t in inner)


class Probe(Protocol):
    """What `offloaded_entries` walks: a callable giving the layer (a weak reference), with a
    `probe` slot naming the parameter to look at first (None: the first one)."""

    probe: str | None

    def __call__(self) -> Any: ...


def offloaded_entries(
    entries: Sequence[Probe], is_device: str | None = None, undecided: list[str] | None = None
) -> list[Any]:
    """The layers of `entries` (weak references with a probe, te/layers.py) whose weights have all
    left the device (`_decide`); `undecided` gets `Class.parameter` of each layer it cannot decide.

    This runs at every allocator flush over every live TE layer, and almost always finds each
    layer on the device. Any one own parameter on the device decides that (the layer is never
    touched), so the loop looks first at the parameter named by the entry's probe: the one found on
    the device at the previous flush, looked up by name in the layer's own `_parameters` (so it is
    always a parameter the layer owns now, never a stale one). That one look is inlined here: a
    device flag and the storage's size, no call of ours, no allocation but the storage's Python
    object. Only when it does not answer "on" are all the layer's parameters read (`_decide`), and
    the probe moves to whichever is on the device. The storage's size, not the tensor's: the views
    megatron-core's buffer offload leaves keep their sizes (and `data_ptr()` their offsets) with a
    zero-byte storage under them. A TE quantized parameter (an FP8 primary weight) takes the same
    one look, at the inner data tensor its type keeps its bytes in (`_QUANTIZED`): on the device
    with bytes there, it is on, as `_subclass_on_device` would find; a type not TE's takes the
    full reading."""
    is_device = is_device or flag()
    flagged = operator.attrgetter(is_device)
    own = object.__getattribute__
    parameter: Any = _plain_types()[1]  # nn.Parameter exactly
    quantized = _QUANTIZED.setdefault(is_device, {})
    found = []
    for entry in entries:
        layer = entry()
        if layer is None:
            continue
        try:
            params = own(layer, "__dict__")["_parameters"]
            name = entry.probe or next(iter(params), None)  # a parameter's name is never empty
            if name is None:
                continue  # no weights: nothing says it was offloaded
            p: Any = params.get(name)
            kind = type(p)
            if kind is parameter:
                if flagged(p) and p.untyped_storage().nbytes():
                    continue  # on the device: the usual answer
            elif kind not in quantized:
                quantized[kind] = _learn(p, is_device)  # a parameter type seen for the first time
            elif (known := quantized[kind]) is not None:
                field, outer = known
                inner = own(p, "__dict__").get(field)
                if inner is not None and (not outer or flagged(p)) and flagged(inner):
                    if inner.untyped_storage().nbytes():
                        continue  # an FP8 primary weight whose data is on the device
        except Exception:
            continue  # not knowing is "on"
        left, on, empty = _decide(layer, is_device)
        if on is not None:
            entry.probe = on
        if left:
            found.append(layer)
        elif empty is not None and undecided is not None:
            undecided.append(f"{type(layer).__name__}.{empty}")
    return found


# The device flag -> parameter types seen by the check -> (the field TE's quantized type keeps its
# data in, whether the wrapper's own device flag must be read too), or None: not TE's (or its first
# instance had no such field set), no one look. The field is the one TE's `is_cuda` reads first
# (Float8Tensor `_data`; MXFP8, Float8Blockwise, NVFP4 `_rowwise_data`: transformer_engine/pytorch/
# tensor/*.py, 2.16 - 2.20), so where TE defines that flag as a property (2.16+) the wrapper's
# answer is the field's and is not read again; before 2.16 it is torch's own flag, read as well.
_QUANTIZED: dict[str, dict[type, tuple[str, bool] | None]] = {}


def _learn(p: Any, is_device: str) -> tuple[str, bool] | None:
    try:
        kind = type(p)
        if not (kind.__module__.startswith("transformer_engine.") and isinstance(p, _plain_types()[0])):
            return None
        d = object.__getattribute__(p, "__dict__")
        field = next((name for name in ("_data", "_rowwise_data") if name in d), None)
        owner = next((k for k in kind.__mro__ if is_device in vars(k)), object)  # TE's property, or torch's
        outer = not (isinstance(vars(owner)[is_device], property) and owner.__module__.startswith("transformer_"))
        return (field, outer) if field is not None and d[field] is not None else None
    except Exception:
        return None


@cache
def _plain_types() -> tuple[type, ...]:
    # torch.Tensor and nn.Parameter exactly (a Parameter made of a tensor subclass is that subclass)
    torch = sys.modules["torch"]
    return torch.Tensor, torch.nn.Parameter


def _sharded(tensor: Any) -> bool:
    if type(tensor).__name__ in _sharded_types:
        return True
    try:
        d = object.__getattribute__(tensor, "__dict__")
    except Exception:
        return True
    return any(mark in d for mark in _sharded_marks)  # present, whatever its value (DeepSpeed's ds_id 0)


def _subclass_on_device(tensor: Any, is_device: str) -> bool:
    """A tensor subclass of the device type: off only when it is TE's quantized tensor and every
    inner data tensor is offloaded (off the device type, or of it with zero bytes under its shape)."""
    d = object.__getattribute__(tensor, "__dict__")
    inner = [d[name] for name in QUANTIZED_DATA if d.get(name) is not None]
    return not inner or any(getattr(t, is_device) and _kept(t) for t in inner)
