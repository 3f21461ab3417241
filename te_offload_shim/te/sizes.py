"""How many bytes TE's cached values hold: their inner tensors, deduplicated by storage.

A TE quantized value keeps its bytes in inner tensors, never in the wrapper (`untyped_storage()` of
a `QuantizedTensor` is empty by design from TE 2.16), and several values may share one (1.x
`Float8Tensor`s share `_scale_inv` through `_fp8_attrs`). This runs once per cache entry at every
offload, so how to open a value is worked out once per class and remembered.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any

# Where the bytes of a cached value live, by TE release (transformer_engine/pytorch/...). Checked
# against each release's real classes by tests/te/test_te_real.py (built on CPU from tensors of known size).
INNER_ATTRS = (
    # 1.x Float8Tensor (float8_tensor.py; `_transpose`, `_scale_inv` are properties over `_fp8_attrs`),
    # 2.0 - 2.8 Float8TensorBase (tensor/_internal), 2.9+ Float8TensorStorage (tensor/storage)
    *("_data", "_transpose", "_scale_inv"),
    # MXFP8, Float8Blockwise (2.3+), NVFP4 (2.8+): base and storage classes, same names throughout
    *("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"),
    *("_amax_rowwise", "_amax_columnwise"),
    # GroupedTensorStorage (2.13+, first cached in 2.19; public field names, no get_metadata);
    # `quantized_tensors` are views into rowwise_data / columnwise_data: same storages, counted once
    *("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax", "columnwise_amax"),
    *("scale", "first_dims", "last_dims", "tensor_offsets", "quantized_tensors"),
    # IdentityTensorStorage (2.19+, Hybrid custom recipes): the high-precision copy itself
    "_hp_data",
    # HybridQuantizedTensorStorage (2.19+): nested storages; DebugQuantizedTensor (2.3+): wrapped values
    *("_rowwise_storage", "_columnwise_storage", "rowwise_gemm_tensor", "columnwise_gemm_tensor"),
)
# Any of these marks an object as a TE storage worth opening (a quantizer has none of them).
STORAGE_MARKS = (
    *("_data", "_rowwise_data", "_columnwise_data", "rowwise_data"),
    *("_hp_data", "_rowwise_storage", "rowwise_gemm_tensor"),
)
MAX_DEPTH = 4  # how deep a value's nested storages are opened

# How to open a value of a given class: (how, getter of its byte-holding attributes as a tuple,
# whether every one of them held a plain tensor or None when the plan was made).
_SELF, _META, _ATTRS, _SEQ, _NOTHING = range(5)
_plans: dict[type, tuple[int, Any, bool]] = {}


def _is_storage(value: Any) -> bool:
    """For TE's own values (a cache entry, a quantized parameter): `hasattr` runs the class's
    attribute lookup, so whatever else a model holds is read by its instance fields instead (the
    residue report's `has_storage_marks`, reports/residue.py)."""
    return any(hasattr(value, mark) for mark in STORAGE_MARKS)


def _known_attrs(value: Any, torch: Any) -> tuple[str, ...]:
    """The names above that `value` has, those its class declares (`_INNER_TENSORS`), and any other
    instance attribute holding a tensor (a field added by a release we have not seen)."""
    declared = [e[0] if isinstance(e, tuple) else e for e in getattr(type(value), "_INNER_TENSORS", ()) or ()]
    own = [k for k, v in getattr(value, "__dict__", {}).items() if isinstance(v, torch.Tensor)]
    names = dict.fromkeys([*declared, *INNER_ATTRS, *own])
    # a wrapper tensor has methods by some of these names (`Tensor.amax`): fields only
    return tuple(n for n in names if isinstance(n, str) and not callable(getattr(value, n, len)))


def _plan(value: Any, torch: Any) -> tuple[int, Any, bool]:
    """How to open objects of `value`'s class: the known attribute names it carries, checked once
    against TE's own enumeration (`get_metadata()`, 2.0+); that enumeration itself when it names a
    tensor the attributes miss (a class from a release we have not seen)."""
    if isinstance(value, (list, tuple)):
        return _SEQ, None, False
    if not _is_storage(value):
        return (_SELF, None, True) if isinstance(value, torch.Tensor) else (_NOTHING, None, False)
    names = _known_attrs(value, torch)
    get_metadata = getattr(value, "get_metadata", None)
    if callable(get_metadata):
        try:
            listed = [v for v in get_metadata().values() if isinstance(v, torch.Tensor) or _is_storage(v)]
        except NotImplementedError:  # an abstract one inherited: the attributes are all there is
            listed = []
        found = {id(getattr(value, n)) for n in names}
        if any(id(v) not in found for v in listed):
            return _META, None, False
    if not names:
        return _NOTHING, None, False
    plain = (torch.Tensor, torch.nn.Parameter, type(None))
    get = attrgetter(*names)  # a tuple always: one name gives the value alone
    getter = get if len(names) > 1 else (lambda value: (get(value),))
    return _ATTRS, getter, all(type(getattr(value, n)) in plain for n in names)


def inner_tensors(value: Any, torch: Any, out: list[Any], depth: int = 0) -> None:
    """Append to `out` the plain tensors that hold `value`'s bytes (and Nones, which callers skip)."""
    cls = type(value)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        out.append(value)
        return
    if value is None or depth > MAX_DEPTH:
        return
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = _plan(value, torch)
    how, getter, flat = plan
    if how == _ATTRS:
        try:
            items = getter(value)
        except AttributeError:  # an instance missing a field its class had when planned
            del _plans[cls]
            items = tuple(getattr(value, n, None) for n in _known_attrs(value, torch))
            flat = False
        if flat:
            out.extend(items)  # checked in `_add`: a field that later holds a storage is opened there
            return
        for item in items:  # a plain tensor is appended at any depth, a None passed over
            if item is not value:
                inner_tensors(item, torch, out, depth + 1)
    elif how == _META:
        for item in value.get_metadata().values():
            inner_tensors(item, torch, out, depth + 1)
    elif how == _SEQ:
        for item in value:
            inner_tensors(item, torch, out, depth + 1)
    elif how == _SELF:
        out.append(value)


def _tensors(values: Any, torch: Any) -> list[Any]:
    """The plain tensors holding `values`, None-free. The hot loop of the accounting: when every
    value is of one known class (the usual chunk: one TE recipe), one attribute getter per value in
    `map`, no bytecode per value or per tensor; otherwise one getter call per value."""
    plain = (torch.Tensor, torch.nn.Parameter)
    kinds = set(map(type, values))
    if kinds.issubset(plain):  # plain tensors already (parameters, the entries of a BF16 cache)
        return list(values)
    plan = _plans.get(kinds.pop()) if len(kinds) == 1 else None
    found: list[Any] | None = None
    if plan is not None and plan[2]:
        try:
            found = list(chain.from_iterable(map(plan[1], values)))
        except AttributeError:  # an instance missing a field: the careful loop below
            found = None
    if found is None:  # mixed classes, or an instance missing a field: value by value
        found = []
        for value in values:
            inner_tensors(value, torch, found)
    kinds = set(map(type, found))
    if kinds.issubset(plain):
        return found
    if kinds.issubset((*plain, type(None))):
        return [t for t in found if t is not None]
    # a field that held a tensor when its class was planned holds a storage now: open it (a plain
    # tensor is appended as it is, a None is skipped)
    opened: list[Any] = []
    for t in found:
        inner_tensors(t, torch, opened, 1)
    return [t for t in opened if t is not None]


def storages(values: Any, torch: Any) -> dict[int, int]:
    """Unique storages holding `values`: {address: nbytes}.

    Keyed by address alone: CUDA's unified virtual addressing gives host and every device
    disjoint addresses, so an address names one storage in the process. This runs per inner tensor
    of every cache entry at every offload: the loops run in C (`map`) over torch's C methods, unbound
    (`TensorBase.untyped_storage`...), so no method is looked up or bound per tensor."""
    storage = torch._C.StorageBase
    held = list(map(torch._C.TensorBase.untyped_storage, _tensors(values, torch)))
    found = dict(zip(map(storage.data_ptr, held), map(storage.nbytes, held), strict=True))
    found.pop(0, None)  # empty storages (and meta tensors) hold nothing
    return found


# Values opened per pass of `count`: a pass makes several sweeps over its inner tensors, each in C;
# small enough that the later sweeps find the tensors still in the CPU cache, big enough that the
# bytecode per pass is amortised (BENCHMARKS.md, the clearing walk's open item).
STEP = 256


def count(values: Any, params: Any, torch: Any) -> tuple[int, int]:
    """Bytes that dropping `values` frees (their unique storages), and bytes of theirs that live in a
    storage one of `params` also lives in (not freed).

    The second figure is the entries' own tensors' bytes (`nbytes`), not their storage's: an entry
    that is a view into a megatron DDP bucket shares the bucket, and the bucket is not the entry's.
    One table for all passes de-duplicates storages across them; the values are all alive until this
    returns, so an address cannot be reused in between."""
    found: dict[int, int] = {}
    for i in range(0, len(values), STEP):
        found.update(storages(values[i : i + STEP], torch))
    # The storages a parameter also lives in, found by the parameter's storage, so a parameter that is
    # a view into a larger buffer (megatron DDP) is found in it. Two tensors over one block of memory
    # with two storage objects of different bounds (`from_blob`, DLPack) are not; TE's caches hold
    # their own tensors or views of them. A quantized parameter (an FP8 primary weight): its inner tensors.
    shared: set[int] = set()
    if found and params:
        held = map(torch._C.TensorBase.untyped_storage, _tensors(list(params), torch))
        shared = found.keys() & set(map(torch._C.StorageBase.data_ptr, held))
    if not shared:
        return sum(found.values()), 0
    views = {(t.data_ptr(), t.nbytes) for t in _tensors(values, torch) if t.untyped_storage().data_ptr() in shared}
    return sum(v for k, v in found.items() if k not in shared), sum(nbytes for _, nbytes in views)
