"""What a model still holds on a device, by category, with TE's process-global memory and the
CUDA-graph private pools: the report users otherwise assemble by hand from memory snapshots after
an offload. The allocator's own totals (allocated, reserved, the driver's) are torch's to print.

One walk over the model chunks (te/walk.py, the pass the clearing makes) reads instance dicts only
(never `nn.Module.__getattr__`, never a property of a module), finds every tensor on the selected
device, and counts each storage once. What a module refers to outside its parameters and buffers
is told apart by type alone, and an object's fields are read only where its type says that reading
them runs nothing (`_plain_fields`): a lazy proxy held by a model is never asked anything.
It moves, frees and keeps nothing: the report holds names and numbers, no tensor or module.
Like the clearing (te/), it never imports torch: torch comes from `sys.modules`.

A storage found through several holders is counted once, for the first category in `CATEGORIES`
order: a parameter that is a view into megatron DDP's `param_data` counts under `ddp_buffers`
(that buffer is the allocation), a `main_grad` view into `grad_data` likewise; a cache entry that
shares a parameter's storage counts under `parameters`.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import islice
from types import BuiltinFunctionType, FunctionType, GetSetDescriptorType, MethodType, ModuleType
from typing import Any

from te_offload_shim._log import human_bytes
from te_offload_shim._signals import raised_by_signal_handler
from te_offload_shim.reports.process_memory import on_device, te_global_memory
from te_offload_shim.te import sizes
from te_offload_shim.te.caching_off import count_caching_off, describe
from te_offload_shim.te.chunks import as_chunks
from te_offload_shim.te.layouts import LEGACY_ATTRS, LEGACY_MARKER, WORKSPACES
from te_offload_shim.te.names import Names
from te_offload_shim.te.process_globals import private_pools
from te_offload_shim.te.walk import walk

CATEGORIES = ("ddp_buffers", "parameters", "fp8_param_caches", "gradients", "buffers", "fp8_workspaces", "other")
TOP = 10
# Megatron DDP's buffer lists (the same as integrations/megatron.py's `DDP_BUFFER_LISTS`, which this report,
# below integrations/, cannot import; tests/reports/test_residue.py keeps the two equal) hold
# `_ParamAndGradBuffer`s whose `param_data` / `grad_data` (and `shared_buffer`) are the allocations
# the parameters and `main_grad`s are views into: every tensor they hold counts under `ddp_buffers`.
DDP_BUFFER_LISTS = ("buffers", "expert_parallel_buffers")
# Holders given a name of their own inside their category. megatron-core 0.17+ `_ParamAndGradBuffer`
# keeps `extra_main_grads`: FP32 `main_grad` copies of the parameters matched by
# `param_name_patterns_for_fp32_local_accumulation`, outside `grad_data`, which `offload_to_cpu`
# leaves where they are (param_and_grad_buffer.py, core_v0.17.0 - core_v0.19.0). Counted under
# `ddp_buffers`, the buffer holds them.
NAMED = {"ddp_buffers": ("extra_main_grads",)}
# Gradients Megatron keeps on the parameter object itself (DDP's `main_grad`; `decoupled_grad` for
# the precision-aware optimizer, megatron/core/optimizer).
GRAD_ATTRS = ("main_grad", "decoupled_grad")
# Inner tensors of a TE FP8 primary weight (fp8_param / fp8_model_init) that are the transposed /
# columnwise copy kept beside the rowwise data (TE tensor/float8_tensor.py `_transpose`,
# mxfp8/float8_blockwise/nvfp4 `_columnwise_*`): about one byte per weight element, outside the
# DDP buffer. The rest of such a parameter counts as `parameters`.
COLUMNWISE_ATTRS = frozenset(
    {
        "_transpose",
        "_columnwise_data",
        "_columnwise_scale_inv",
        "_amax_columnwise",
        "columnwise_data",
        "columnwise_scale_inv",
        "_columnwise_storage",
        "columnwise_gemm_tensor",
    }
)
# `other`: how far to follow a module attribute into containers and plain objects (MoE token
# dispatcher state sits one object below its module, TE's FP8 recipe state two), and how many
# items of one container to read.
_MAX_DEPTH = 3
_MAX_ITEMS = 4096
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_OPAQUE = (type, ModuleType, FunctionType, MethodType, BuiltinFunctionType)


@dataclass
class Holder:
    """One place that keeps bytes on the device: module path (`chunk0.module.decoder...`) and
    attribute (`weight`, `weight.main_grad`, `_fp8_workspaces[weight]`, `buffers[0].param_data`)."""

    path: str
    attribute: str
    category: str
    bytes: int


@dataclass
class ResidueReport:
    """What `residue()` found. `total_bytes` is the sum of `by_category` (unique storages);
    `other` breaks the `other` category down by attribute name, largest first; `named` gives the
    bytes of holders with a name of their own inside their category (`NAMED`), where any hold bytes;
    `private_pools` the bytes reserved in CUDA-graph private pools and MemPools per device; `top` are the
    largest holders; `te_global` is TE's process-global memory (not in `total_bytes`, never
    cleared by the shim; None where present but not sizeable from Python); `caching_off` the TE
    layers that hold no FP8 weight cache because caching is off by configuration
    (te/caching_off.py), by reason."""

    device_type: str | None = None
    total_bytes: int = 0
    storages: int = 0
    by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    other: dict[str, int] = field(default_factory=dict)
    named: dict[str, int] = field(default_factory=dict)
    top: list[Holder] = field(default_factory=list)
    te_global: dict[str, int | None] = field(default_factory=dict)
    private_pools: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    caching_off: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # the holders too, as plain dicts

    def summary(self) -> str:
        """One line: the residue by category, TE's global memory, the private pools."""
        parts = [f"{name} {human_bytes(n)}" for name, n in self.by_category.items() if n]
        if self.other:
            parts[-1] += f" ({_sizes(dict(islice(self.other.items(), 3)))})"
        where = self.device_type or "device"
        line = f"left on {where}: {human_bytes(self.total_bytes)}" + (f" ({', '.join(parts)})" if parts else "")
        notes = (  # each where it has something to say
            self.named and f"of which {_sizes(self.named)}",
            self.caching_off and f"FP8 weight caching off by configuration in {describe(self.caching_off)}",
            self.te_global and f"TE process-global: {_sizes(self.te_global)}",
            self.private_pools and f"private pools (CUDA graphs, MemPools): {_sizes(self.private_pools)}",
            self.errors and f"{len(self.errors)} error(s): {self.errors[0]}",
        )
        return "; ".join([line, *(note for note in notes if note)])


def _sizes(found: dict[str, int] | dict[str, int | None]) -> str:
    """`name BYTES, ...`; a size that cannot be read (None) as `present`."""
    return ", ".join(f"{k} {'present' if v is None else human_bytes(v)}" for k, v in found.items())


def residue(models: object, *, device_type: str | None = None, top: int = TOP) -> ResidueReport:
    """Every tensor `models` (a module or a list of model chunks) still holds on a device, by
    category, each storage counted once, with TE's process-global memory and the private pools.

    `device_type=None` counts tensors on any device that is not the CPU; `"cuda"`, `"cpu"`...
    count exactly that device type. Never raises: what went wrong is in `errors`."""
    report = ResidueReport(device_type=device_type)
    torch = sys.modules.get("torch")
    if torch is None:
        return report
    steps = (
        ("walk", lambda: _Walk(torch, device_type).run(models, report, top)),
        ("TE global", lambda: setattr(report, "te_global", te_global_memory(torch, device_type))),
        ("private pools", lambda: setattr(report, "private_pools", private_pools(torch))),
    )
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # a diagnostic must not fail the run it diagnoses
            report.errors.append(_error(what, exc))
    return report


def _error(where: str, exc: BaseException) -> str:
    """`where: Type: message`, for `errors`. What the application's signal handler raised while the
    report ran (a step timeout, a preemption notice) is no failure of the report's: raised on, as
    every fail-open path of the package does (`_log.fail_open`)."""
    if raised_by_signal_handler(exc):
        raise exc
    return f"{where}: {type(exc).__name__}: {exc}"


# A module of the tree, as the call that gives its path (its chunk's te/names.py Names, bound to it):
# paths are worked out only for the reported holders, as `named_modules()` gives them.
_Node = Callable[[], str]


def _label(attribute: str | tuple[str, Any]) -> str:
    return attribute if isinstance(attribute, str) else f"{attribute[0]}[{attribute[1]}]"


# Read without the metaclass's attribute lookup: a class's MRO and its own namespace.
_MRO = type.__dict__["__mro__"].__get__
_NAMESPACE = type.__dict__["__dict__"].__get__


def _plain_fields(value: Any) -> dict | None:
    """`value`'s instance dict when its type says reading it runs nothing of the application's (no
    class of its MRO defines `__getattribute__`, and its `__dict__` is a getset slot, as a class
    statement makes it: no property), else None. wrapt's proxies (`LazyObjectProxy`) define
    `__getattribute__`: left unread, the factory never runs. A proxy forwarding only `__getattr__`
    (Django's `LazyObject`) has its own fields read, never its target's."""
    descriptor = None
    for klass in _MRO(type(value)):
        if klass is object:
            break
        namespace = _NAMESPACE(klass)
        if "__getattribute__" in namespace:
            return None
        if descriptor is None and "__dict__" in namespace:
            descriptor = namespace["__dict__"]
    if type(descriptor) is not GetSetDescriptorType:
        return None  # no instance dict (slots), or a `__dict__` property
    fields = descriptor.__get__(value, type(value))
    return fields if type(fields) is dict else None


def has_storage_marks(fields: dict) -> bool:
    """Whether an object's instance fields (read without running its class's code) mark it as a TE
    storage (`sizes.STORAGE_MARKS`): TE's storage classes keep their tensors as plain instance
    attributes. Here, not in te/sizes.py: the clearing asks TE's own values (`hasattr`), and only
    this report reads whatever else a model holds."""
    return any(mark in fields for mark in sizes.STORAGE_MARKS)


class _Walk:
    """One pass: collect (category, holder, tensor) for tensors on the device, then claim storages
    in category order."""

    def __init__(self, torch: Any, device_type: str | None) -> None:
        self.torch = torch
        self.plain = (torch.Tensor, torch.nn.Parameter)
        self.module_type = torch.nn.Module
        self.found: dict[str, list[tuple[_Node, Any, str, Any]]] = {c: [] for c in CATEGORIES}
        self.seen_objects: set[int] = set()
        self.internal = frozenset(torch.nn.Module().__dict__) | {WORKSPACES, LEGACY_MARKER, *LEGACY_ATTRS}
        self.on_device = on_device(device_type)

    # --- collecting ---------------------------------------------------------------------------

    def add(self, category: str, node: _Node, attribute: str | tuple[str, Any], value: Any, key: str = "") -> None:
        """Every plain tensor holding `value`'s bytes, if it is on the device."""
        if type(value) in self.plain:
            if self.on_device(value):
                self.found[category].append((node, attribute, key, value))
            return
        if value is None:
            return
        inner: list[Any] = []
        sizes.inner_tensors(value, self.torch, inner)
        for t in inner:
            if t is not None and self.on_device(t):  # inner_tensors leaves Nones for its callers to skip
                self.found[category].append((node, attribute, key, t))

    def run(self, models: object, report: ResidueReport, top: int) -> None:
        chunks, refused = as_chunks(models)  # never iterates what the offload will iterate
        if refused is not None:
            report.errors.append(f"models not inspected: {refused}")
        seen: set[int] = set()  # a module two chunks share is walked once, in the first
        for index, chunk in enumerate(chunks):
            names = Names(index, chunk)
            tree = walk(chunk, every=True, seen=seen)
            for module, exc in tree.unreadable:  # one odd module must not hide the rest
                report.errors.append(_error(names(module), exc))
            for module, d in zip(tree.every, tree.every_dicts, strict=True):
                try:
                    self.module(partial(names, module), d, report)
                except Exception as exc:  # one odd module must not hide the rest
                    report.errors.append(_error(names(module), exc))
        self.claim(report, top)

    def module(self, node: _Node, d: dict, report: ResidueReport) -> None:
        for name, p in (d.get("_parameters") or {}).items():
            if type(p) in self.plain and p.grad is None and not p.__dict__:
                self.add("parameters", node, name, p)  # the common case: one call per parameter
            elif p is not None:
                self.parameter(node, name, p)
        for name, b in (d.get("_buffers") or {}).items():
            self.add("buffers", node, name, b)
        workspaces = d.get(WORKSPACES)
        if type(workspaces) is dict:
            for key, value in workspaces.items():
                self.add("fp8_workspaces", node, (WORKSPACES, key), value)
        elif workspaces:  # not TE's plain dict: whatever tensors it holds
            self.add("fp8_workspaces", node, WORKSPACES, workspaces)
        if WORKSPACES in d and not workspaces:  # a TE layer holding nothing: is its caching off?
            count_caching_off(d, report.caching_off)
        if LEGACY_MARKER in d:  # TE < 1.8: never cleared (see te/layouts.py)
            for name in LEGACY_ATTRS:
                self.add("fp8_workspaces", node, name, d.get(name))
        for name in sorted(d.keys() - self.internal):
            value = d[name]
            if type(value) in _SCALARS:
                continue
            # megatron DDP's buffer lists: what their `_ParamAndGradBuffer`s hold is the buffer's
            category = "ddp_buffers" if name in DDP_BUFFER_LISTS else "other"
            try:
                self.other(node, name, name, value, 0, category)
            except Exception as exc:  # one odd attribute costs only itself
                report.errors.append(_error(f"{node()}.{name}", exc))

    def parameter(self, node: _Node, name: str, p: Any) -> None:
        parts = []
        if type(p) not in self.plain:  # a TE FP8 primary weight (or another tensor subclass)
            parts = [(n, getattr(p, n, None)) for n in sizes.INNER_ATTRS]
            # fields only: a tensor subclass has methods by some of these names (`Tensor.amax`)
            parts = [(n, v) for n, v in parts if v is not None and v is not p and not callable(v)]
        if not parts:
            self.add("parameters", node, name, p)
        for inner_name, value in parts:
            category = "fp8_param_caches" if inner_name in COLUMNWISE_ATTRS else "parameters"
            self.add(category, node, f"{name}.{inner_name}", value)
        self.add("gradients", node, f"{name}.grad", p.grad)
        own = getattr(p, "__dict__", None) or {}
        for grad in GRAD_ATTRS:
            self.add("gradients", node, f"{name}.{grad}", own.get(grad))

    # The values below are anything a module refers to, so they are told apart by their type alone,
    # never by an attribute of theirs: `isinstance` reads `__class__` when the type does not match,
    # and a lazily loaded module executes on any attribute read (a lazy proxy may raise instead).

    def other(self, node: _Node, label: str, key: str, value: Any, depth: int, category: str = "other") -> None:
        """Tensors a module keeps outside parameters and buffers, by attribute path (`key` leaves
        out container positions, so `other` adds them up per attribute), under `category`."""
        cls = type(value)
        if cls in _SCALARS or issubclass(cls, _OPAQUE) or issubclass(cls, self.module_type):
            return  # modules are walked through `_modules`; one merely referenced is not ours
        if cls in self.plain or issubclass(cls, self.torch.Tensor):
            self.add(category, node, label, value, key)
            return
        fields = None
        if cls not in (list, tuple) and not issubclass(cls, dict):
            fields = _plain_fields(value)
            if fields is None:
                return  # reading it could run the application's code: left unread
            if has_storage_marks(fields):  # a TE quantized value outside the workspace dict
                self.storage(node, label, key, fields, 0, category)
                return
        if depth >= _MAX_DEPTH or id(value) in self.seen_objects:
            return
        self.seen_objects.add(id(value))
        if cls in (list, tuple):
            for i, item in enumerate(islice(value, _MAX_ITEMS)):  # exactly a list or tuple: no own __iter__
                self.other(node, f"{label}[{i}]", key, item, depth + 1, category)
        elif fields is None:  # a dict, read through dict's own methods (never a subclass's)
            for i, (k, item) in enumerate(islice(dict.items(value), _MAX_ITEMS)):
                if type(k) is str:
                    self.other(node, f"{label}[{k}]", f"{key}.{k}", item, depth + 1, category)
                else:
                    self.other(node, f"{label}[{i}]", key, item, depth + 1, category)
        else:
            for k, item in list(fields.items())[:_MAX_ITEMS]:
                self.other(node, f"{label}.{k}", f"{key}.{k}", item, depth + 1, category)

    def storage(self, node: _Node, label: str, key: str, fields: dict, depth: int, category: str) -> None:
        """The tensors of a TE storage found outside the workspace dict, from its instance fields
        (`sizes.INNER_ATTRS`) and nested storages: its class's attributes are never read."""
        tensor = self.torch.Tensor
        for name in sizes.INNER_ATTRS:
            item = fields.get(name)  # a None is a scalar: passed over below
            if issubclass(type(item), tensor):
                self.add(category, node, label, item, key)
            elif depth < sizes.MAX_DEPTH and type(item) not in _SCALARS:
                nested = _plain_fields(item)
                if nested is not None and has_storage_marks(nested):
                    self.storage(node, label, key, nested, depth + 1, category)

    # --- counting -----------------------------------------------------------------------------

    def claim(self, report: ResidueReport, top: int) -> None:
        claimed: set[int] = set()
        holders: dict[tuple[int, str, str], list[Any]] = {}
        other, named = report.other, report.named  # added up here; `other` sorted at the end
        for category in CATEGORIES:
            own_names = NAMED.get(category, ())
            for node, attribute, key, t in self.found[category]:
                try:
                    storage = t.untyped_storage()
                    address, size = storage.data_ptr(), storage.nbytes()
                except Exception as exc:  # a tensor subclass without a storage (DTensor, fake)
                    error = _error(f"{node()}.{_label(attribute)}", exc)
                    if len(report.errors) < 10:
                        report.errors.append(error)
                    continue
                if not address or not size or address in claimed:
                    continue
                claimed.add(address)
                report.by_category[category] += size
                slot = holders.setdefault((id(node), attribute, category), [node, attribute, category, 0])
                slot[3] += size
                if category == "other":
                    name = key or _label(attribute)
                    other[name] = other.get(name, 0) + size
                elif own_names and type(attribute) is str:
                    own = attribute.rpartition(".")[2].partition("[")[0]  # `extra_main_grads[3]`
                    if own in own_names:
                        named[own] = named.get(own, 0) + size
        report.storages = len(claimed)
        report.total_bytes = sum(report.by_category.values())
        report.other = dict(sorted(other.items(), key=lambda kv: -kv[1]))
        largest = heapq.nlargest(top, holders.values(), key=lambda s: s[3])
        report.top = [Holder(node(), _label(attribute), category, n) for node, attribute, category, n in largest]
        self.found.clear()
