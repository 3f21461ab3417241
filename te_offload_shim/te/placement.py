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

import sys
from typing import Any

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
    managed by a sharding wrapper."""
    try:
        params = object.__getattribute__(layer, "__dict__").get("_parameters")
        if not params:
            return False
        is_device = is_device or flag()
        values = [p for p in params.values() if p is not None]
        if not values or on_device(values[0], is_device):  # the usual answer, after one look
            return False
        return not any(_sharded(p) or on_device(p, is_device) for p in values)
    except Exception:
        return False


_PLAIN: tuple[type, ...] = ()


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
