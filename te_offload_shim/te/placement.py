"""Whether a TE layer's weights have left the device: the flush net's rule for "this layer was offloaded".

A layer has left the device when it has at least one parameter of its own and none of them is on
the device. A tensor is on the device when it is of the device type (`DEVICE_TYPE`, read through
the tensor's own `is_<type>` flag) and its storage holds bytes. So a parameter moved to the CPU or
to `meta`, and one whose storage was resized to zero bytes (what megatron-core's buffer
`offload_to_cpu` and verl's `storage().resize_(0)` leave; what AReaL's and SkyRL's
`param.data = torch.empty(0, ...)` swap in), are off; a layer with one weight still on the device
is on, and is never touched.

A sharding wrapper frees weight storage between microbatches too (a reshard, not an offload): a
parameter that such a wrapper manages never counts as off, wherever its data is. They are told by
the mark each one leaves: FSDP1's `_fsdp_flattened` on every original parameter (torch
distributed/fsdp/_flat_param.py), Megatron-FSDP's `__fsdp_param__` (megatron_fsdp.py,
megatron-core 0.14+), and FSDP2's DTensor parameters. Any other tensor subclass on the device
(TE's FP8 primary weights) is on unless every inner data tensor TE keeps it in holds zero bytes;
one that cannot be read is on. Not knowing means "on": the net then clears nothing.

`DEVICE_TYPE` is the one seam: a CPU stand-in for the device answers `is_cuda` for its CPU tensors
(harness/te_twin does), and a test of the rule on plain CPU tensors sets it to "cpu".
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

DEVICE_TYPE = "cuda"  # the device type whose tensors count as "on the device"

# Instance attributes by which a sharding wrapper marks the parameters it manages (see above).
SHARDING_MARKS = ("_fsdp_flattened", "__fsdp_param__")
# Where a TE quantized parameter keeps its bytes (te/sizes.py has the full list, for caches).
QUANTIZED_DATA = ("_data", "_rowwise_data", "_columnwise_data")


def flag() -> str:
    """The tensor attribute that says "of the device type" (`is_cuda`), read once per flush."""
    return f"is_{DEVICE_TYPE}"


def on_device(tensor: Any, is_device: str | None = None) -> bool:
    """Whether `tensor` is on the device and holds bytes there. Cheap for a plain tensor (one flag,
    one storage size): the net asks it of one parameter per TE layer at every flush."""
    try:
        if not getattr(tensor, is_device or flag()):
            return False
        if type(tensor) not in _plain_types():
            return _subclass_on_device(tensor)
        return tensor.untyped_storage().nbytes() > 0
    except Exception:
        return True  # not knowing is "on": the layer is left alone


def left_device(layer: Any, is_device: str | None = None) -> bool:
    """Whether every one of `layer`'s own parameters (at least one) has left the device, and none is
    managed by a sharding wrapper (wherever that wrapper's data is: on the device, on the CPU
    after a CPU offload of FSDP1 or FSDP2, or freed by a reshard)."""
    return _decide(layer, is_device or flag())[0]


def _decide(layer: Any, is_device: str) -> tuple[bool, str | None]:
    """(`left_device(layer)`, the name of an own parameter found on the device, or None)."""
    try:
        params = object.__getattribute__(layer, "__dict__").get("_parameters")
        if not params:
            return False, None
        found = False
        for name, p in list(params.items()):
            if p is None:
                continue
            if _sharded(p):
                return False, None  # a sharding wrapper's weight: never an offload, on or off the device
            if on_device(p, is_device):
                return False, name
            found = True
        return found, None
    except Exception:
        return False, None


class Probe(Protocol):
    """What `offloaded_entries` walks: a callable giving the layer (a weak reference), with a
    `probe` slot naming the parameter to look at first (None: the first one)."""

    probe: str | None

    def __call__(self) -> Any: ...


class _Held:
    __slots__ = ("layer", "probe")
    probe: str | None

    def __init__(self, layer: Any) -> None:
        self.layer, self.probe = layer, None

    def __call__(self) -> Any:
        return self.layer


_PLAIN: tuple[type, ...] = ()


def offloaded(layers: Iterable[Any], is_device: str | None = None) -> list[Any]:
    """The layers of `layers` whose weights have all left the device (`left_device`)."""
    return offloaded_entries([_Held(layer) for layer in layers], is_device)


def offloaded_entries(entries: Sequence[Probe], is_device: str | None = None) -> list[Any]:
    """The layers of `entries` (weak references with a probe, te/layers.py) whose weights have all
    left the device (`left_device`).

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
            name = entry.probe
            if name is None:
                name = next(iter(params), None)
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
        left, on = _decide(layer, is_device)
        if on is not None:
            entry.probe = on
        if left:
            found.append(layer)
    return found


# The device flag -> parameter types seen by the check -> (the field TE's quantized type keeps its
# data in, whether the wrapper's own device flag must be read too), or None: not TE's (or its first
# instance had no such field set), no one look. The field is the one TE's `is_cuda` reads first
# (Float8Tensor `_data`; MXFP8, Float8Blockwise, NVFP4 `_rowwise_data`: transformer_engine/pytorch/
# tensor/*.py, 2.16 - 2.20), so where TE defines that flag as a property (2.16+) the wrapper's
# answer is the field's and is not read again; before 2.16 it is torch's own flag, read as well.
_QUANTIZED: dict[str, dict[type, tuple[str, bool] | None]] = {}


def _learn(p: Any, is_device: str) -> tuple[str, bool] | None:
    known = None
    try:
        kind = type(p)
        if kind.__module__.startswith("transformer_engine.") and isinstance(p, _plain_types()[0]):
            d = object.__getattribute__(p, "__dict__")
            field = next((name for name in ("_data", "_rowwise_data") if name in d), None)
            owner = next((k for k in kind.__mro__ if is_device in vars(k)), object)  # TE's property, or torch's
            outer = not (isinstance(vars(owner)[is_device], property) and owner.__module__.startswith("transformer_"))
            known = (field, outer) if field is not None and d[field] is not None else None
    except Exception:
        pass
    return known


def _plain_types() -> tuple[type, ...]:
    # torch.Tensor and nn.Parameter exactly (a Parameter made of a tensor subclass is that subclass)
    global _PLAIN
    if not _PLAIN:
        torch = sys.modules["torch"]
        _PLAIN = (torch.Tensor, torch.nn.Parameter)
    return _PLAIN


def _sharded(tensor: Any) -> bool:
    if type(tensor).__name__ == "DTensor":
        return True
    try:
        d = object.__getattribute__(tensor, "__dict__")
    except Exception:
        return True
    return any(d.get(mark) for mark in SHARDING_MARKS)


def _subclass_on_device(tensor: Any) -> bool:
    """A tensor subclass of the device type: off only when it is TE's quantized tensor and every
    inner data tensor holds zero bytes (or has left the device)."""
    if type(tensor).__name__ == "DTensor":
        return True
    d = object.__getattribute__(tensor, "__dict__")
    inner = [d[name] for name in QUANTIZED_DATA if d.get(name) is not None]
    if not inner:
        return True
    for t in inner:
        if getattr(t, flag()) and t.untyped_storage().nbytes() > 0:
            return True
    return False
