"""How many bytes TE's cached values hold: their inner tensors, deduplicated by storage.

A TE quantized value keeps its bytes in inner tensors, never in the wrapper (`untyped_storage()` of
a `QuantizedTensor` is empty by design from TE 2.16), and several values may share one (1.x
`Float8Tensor`s share `_scale_inv` through `_fp8_attrs`). This runs once per cache entry at every
offload, so how to open a value is worked out once per class and remembered.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

# Where the bytes of a cached value live, by TE release (transformer_engine/pytorch/...).
INNER_ATTRS = (
    # 1.x Float8Tensor (float8_tensor.py; `_transpose`, `_scale_inv` are properties over `_fp8_attrs`),
    # 2.0 - 2.8 Float8TensorBase (tensor/_internal), 2.9+ Float8TensorStorage (tensor/storage)
    "_data",
    "_transpose",
    "_scale_inv",
    # MXFP8, Float8Blockwise (2.3+), NVFP4 (2.8+): base and storage classes, same names throughout
    "_rowwise_data",
    "_columnwise_data",
    "_rowwise_scale_inv",
    "_columnwise_scale_inv",
    "_amax_rowwise",
    "_amax_columnwise",
    # GroupedTensorStorage (2.13+; public field names, no get_metadata)
    "rowwise_data",
    "columnwise_data",
    "scale_inv",
    "columnwise_scale_inv",
    "quantized_tensors",
    # HybridQuantizedTensorStorage (main): nested storages; DebugQuantizedTensor (2.3+): wrapped values
    "_rowwise_storage",
    "_columnwise_storage",
    "rowwise_gemm_tensor",
    "columnwise_gemm_tensor",
)
# Any of these marks an object as a TE storage worth opening (a quantizer has none of them).
STORAGE_MARKS = (
    "_data",
    "_rowwise_data",
    "_columnwise_data",
    "rowwise_data",
    "_rowwise_storage",
    "rowwise_gemm_tensor",
)
_MAX_DEPTH = 4

# How to open a value of a given class.
_SELF, _META, _ATTRS, _SEQ, _NOTHING = range(5)
_plans: dict[type, tuple[int, tuple[str, ...]]] = {}


def _is_storage(value: Any) -> bool:
    return any(hasattr(value, mark) for mark in STORAGE_MARKS)


def _known_attrs(value: Any) -> tuple[str, ...]:
    declared = [e[0] if isinstance(e, tuple) else e for e in getattr(type(value), "_INNER_TENSORS", ()) or ()]
    return tuple(n for n in dict.fromkeys([*declared, *INNER_ATTRS]) if isinstance(n, str) and hasattr(value, n))


def _plan(value: Any, torch: Any) -> tuple[int, tuple[str, ...]]:
    """How to open objects of `value`'s class: the known attribute names it carries, checked once
    against TE's own enumeration (`get_metadata()`, 2.0+); that enumeration itself when it names a
    tensor the attributes miss (a class from a release we have not seen)."""
    if isinstance(value, (list, tuple)):
        return _SEQ, ()
    if not _is_storage(value):
        return (_SELF, ()) if isinstance(value, torch.Tensor) else (_NOTHING, ())
    names = _known_attrs(value)
    get_metadata = getattr(value, "get_metadata", None)
    if callable(get_metadata):
        try:
            listed = [v for v in get_metadata().values() if isinstance(v, torch.Tensor) or _is_storage(v)]
        except NotImplementedError:  # DebugQuantizedTensor inherits an abstract one
            listed = []
        found = {id(getattr(value, n)) for n in names}
        if any(id(v) not in found for v in listed):
            return _META, ()
    return _ATTRS, names


def inner_tensors(value: Any, torch: Any, out: list[Any], depth: int = 0) -> None:
    """Append to `out` the plain tensors that hold `value`'s bytes."""
    cls = type(value)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        out.append(value)
        return
    if value is None or depth > _MAX_DEPTH:
        return
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = _plan(value, torch)
    kind, names = plan
    if kind == _ATTRS:
        plain = (torch.Tensor, torch.nn.Parameter)
        for name in names:
            item = getattr(value, name, None)
            if type(item) in plain:  # the common case, without a call per tensor
                out.append(item)
            elif item is not None and item is not value:
                inner_tensors(item, torch, out, depth + 1)
    elif kind == _META:
        for item in value.get_metadata().values():
            if item is not None:
                inner_tensors(item, torch, out, depth + 1)
    elif kind == _SEQ:
        for item in value:
            inner_tensors(item, torch, out, depth + 1)
    elif kind == _SELF:
        out.append(value)


def storages(values: Any, torch: Any) -> dict[int, int]:
    """Unique storages holding `values`: {address: nbytes}.

    Keyed by address alone: CUDA's unified virtual addressing gives host and every device
    disjoint addresses, so an address names one storage in the process."""
    tensors: list[Any] = []
    for value in values:
        inner_tensors(value, torch, tensors)
    found: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        found[storage.data_ptr()] = storage.nbytes()
    found.pop(0, None)  # empty storages (and meta tensors) hold nothing
    return found


def shared_with(held: dict[int, int], params: Any, torch: Any) -> set[int]:
    """The storages in `held` that a parameter also lives in (its data address falls inside).

    Addresses, not storage objects: a parameter's `data_ptr()` costs no Python storage object, and a
    parameter that is a view into a larger buffer (megatron DDP) is still found."""
    if not held:
        return set()
    starts = sorted(held)
    shared: set[int] = set()
    tensors: list[Any] = []
    for p in params:
        inner_tensors(p, torch, tensors)
    for t in tensors:
        address = t.data_ptr()
        i = bisect_right(starts, address) - 1
        if i >= 0 and address < starts[i] + held[starts[i]]:
            shared.add(starts[i])
    return shared
