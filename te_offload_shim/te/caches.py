"""Transformer Engine's cached quantized weights: find them, count their bytes, drop them.

This is the only place where the shim touches TE internals. It knows TE's layouts by version and
nothing of verl, Ray or wrapt; Megatron's CUDA-graph marks, which the walk reads on its way, come
from integrations/megatron.py. It never imports torch or TE: it works on the objects it is given,
with torch taken from `sys.modules` (if torch is not imported, there is nothing to clear).

Layouts (TE source files named so they can be checked again):

* TE >= 1.8 (`transformer_engine/pytorch/module/base.py`): `self._fp8_workspaces`, a plain dict
  filled by `get_fp8_workspace()` (1.8 - 1.13), `get_weight_workspace()` (2.0 - 2.14),
  `quantize_weight()` (2.15+). TE rebuilds a missing entry on the next forward, so popping the
  entries is safe. Keys: "weight" (Linear, LayerNormLinear), "fc1_weight",
  "fc2_weight" (LayerNormMLP), "weight0".."weightN-1" (GroupedLinear, 1.9+), "weight" too for a
  GroupedLinear with `single_grouped_weight=True` (2.19+).
* TE before 1.8, 0.x included (`module/base.py` sets `fp8_weight_shapes`): attributes `weight{i}_fp8` and
  `weight{i}_t_fp8`. NOT safe to drop: a later forward with `is_first_microbatch=False`
  re-allocates an uninitialised buffer and uses it unfilled. Left alone, reported as skipped.

The values are quantized tensors whose bytes live in inner tensors, never in the wrapper: counting
them is `sizes`'s job.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from te_offload_shim import _switches
from te_offload_shim._log import warn_once
from te_offload_shim.integrations.megatron import GRAPH_LIST, GRAPH_SUBMODULE, cuda_graph_reason
from te_offload_shim.te import sizes

if TYPE_CHECKING:
    from collections.abc import Iterable

WORKSPACES = "_fp8_workspaces"
LEGACY_MARKER = "fp8_weight_shapes"
LEGACY_ATTRS = ("weight1_fp8", "weight1_t_fp8", "weight2_fp8", "weight2_t_fp8")

# TE's own marks (transformer_engine/pytorch/graph.py, 1.9 - 2.20; checked against each release's
# graph.py by tests/hostile/test_te_cuda_graphs.py):
# `make_graphed_callables(module, ...)` sets instance attributes that are functions of that module:
# `forward` = `_make_graphed_callables.<locals>.make_graphed_forward.<locals>.new_fwd` (without `_order`),
# before 2.8 also `forward` = `make_graphed_callables.<locals>.wrap_autocast.<locals>.forward_func`
# (left in place even with `_order`), and from 2.10 `reset` / `backward_dw`. Recognised by the
# function's module, so a renamed closure in a later release is still caught.
TE_GRAPH_MODULE = "transformer_engine.pytorch.graph"
TE_GRAPH_ATTRS = ("forward", "reset", "backward_dw")


@dataclass
class Skipped:
    """Caches the shim saw and deliberately left in place."""

    where: str
    reason: str
    entries: int = 0
    bytes: int = 0


@dataclass
class CacheReport:
    """What one clearing (or scan) found. `bytes` counts unique storages held by the entries only;
    storages the module's own parameters also hold are in `bytes_shared` (clearing frees none of
    them). `released_bytes` is measured with the CUDA allocator around the clearing, when CUDA is
    initialised; an entry still referenced elsewhere shows up as not released."""

    cleared: bool = True
    entries: int = 0
    modules: int = 0
    bytes: int = 0
    bytes_shared: int = 0
    released_bytes: int | None = None
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # FP8 primary weights (`fp8_model_init` / megatron `fp8_param`): TE creates no workspace for
    # them, but the parameter itself carries a transpose / columnwise copy outside the DDP buffer
    # (Float8Tensor `_transpose`; MXFP8, blockwise, NVFP4 `_columnwise_*`), which an offload leaves
    # on the GPU. Reported; Float8Tensor transposes are also dropped (primary_weight_copies).
    primary_weight_params: int = 0
    primary_weight_bytes: int = 0  # left in place
    primary_weight_cleared: int = 0  # Float8Tensor transposes dropped through TE's update_usage (TE 2.4+)
    primary_weight_where: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cleared": self.cleared,
            "entries": self.entries,
            "modules": self.modules,
            "bytes": self.bytes,
            "bytes_shared": self.bytes_shared,
            "released_bytes": self.released_bytes,
            "skipped": [vars(s).copy() for s in self.skipped],
            "errors": list(self.errors),
            "primary_weight_params": self.primary_weight_params,
            "primary_weight_bytes": self.primary_weight_bytes,
            "primary_weight_cleared": self.primary_weight_cleared,
            "primary_weight_where": list(self.primary_weight_where),
        }


class ShimError(RuntimeError):
    """Raised in strict mode for what would otherwise be a warning."""


def _torch() -> Any:
    return sys.modules.get("torch")


def as_chunks(models: object) -> tuple[list[Any], str | None]:
    """The model chunks in `models`, and why `models` was not looked into (None when it was).

    Only a module (one chunk), a list or a tuple (subclasses too) are looked into, a list or tuple
    through `list.__iter__` / `tuple.__iter__`: the offload iterates `models` itself right after
    us, so iterating anything else (a generator, a class whose `__iter__` drains a queue, an
    overridden `__iter__`) could change what it then sees. A value that is not iterable at all is
    passed over in silence: the offload raises its own error for it."""
    torch = _torch()
    if models is None or torch is None:
        return [], None
    module_type = torch.nn.Module
    if isinstance(models, module_type):
        return [models], None
    kind = type(models)
    if issubclass(kind, list):
        items: Iterator[Any] = list.__iter__(models)  # type: ignore[arg-type]
    elif issubclass(kind, tuple):
        items = tuple.__iter__(models)  # type: ignore[arg-type]
    elif getattr(kind, "__iter__", None) is not None or getattr(kind, "__getitem__", None) is not None:
        return [], _not_iterated(models)
    else:
        return [], None
    return [m for m in items if isinstance(m, module_type)], None


def _not_iterated(models: object) -> str:
    kind = type(models)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    what = f"a one-shot iterator ({name})" if isinstance(models, Iterator) else f"a {name}"
    warn_once(
        f"not-iterated:{name}",
        "te_offload_shim: models given as %s; FP8 caches not cleared: the shim looks only into a module, a list "
        "or a tuple, since iterating anything else could change what the offload sees. Pass a list.",
        what,
    )
    return f"models is {what}, not a module, list or tuple: not iterated, nothing cleared"


class _Tree(NamedTuple):
    """What one walk over a chunk found."""

    modern: list[tuple[Any, dict]]
    legacy: list[tuple[Any, dict]]
    graph_mark: str | None
    unreadable: list[tuple[Any, Exception]]  # modules reading which raised: left alone, reported


def _child_modules(module: Any) -> list[tuple[str, Any]]:
    """(name, child) of `module`, even when its class overrides `__dict__`: the generic attribute
    lookup reads the instance dict directly, never through a `__dict__` property."""
    try:
        children = object.__getattribute__(module, "_modules")
        return [(k, v) for k, v in children.items() if v is not None] if isinstance(children, dict) else []
    except Exception:
        return []


def _walk(chunk: Any) -> _Tree:
    """One pass over the module tree reading instance dicts only.

    `getattr(module, "_fp8_workspaces", None)` on a non-TE module goes through
    `nn.Module.__getattr__` and raises inside it; reading `__dict__` avoids that. This loop runs
    once per module of a model of up to millions of modules, hence the local aliases. A module
    that cannot be read costs only itself: its children are still walked."""
    modern: list[tuple[Any, dict]] = []
    legacy: list[tuple[Any, dict]] = []
    unreadable: list[tuple[Any, Exception]] = []
    graph_mark = None
    seen: set[int] = set()
    stack = [chunk]
    pop, push, mark_seen = stack.pop, stack.extend, seen.add
    while stack:
        module = pop()
        if module is None or id(module) in seen:
            continue
        mark_seen(id(module))
        try:
            d = module.__dict__
            children = d.get("_modules")
            if children:
                if graph_mark is None and children.get(GRAPH_SUBMODULE) is not None:
                    graph_mark = f"{type(module).__name__}.{GRAPH_SUBMODULE} is set"
                push(children.values())
            if graph_mark is None and GRAPH_LIST in d and d[GRAPH_LIST]:
                graph_mark = f"{type(module).__name__}.{GRAPH_LIST} holds captured graphs"
            if graph_mark is None and ("forward" in d or "reset" in d or "backward_dw" in d):
                graph_mark = te_graph_mark(module)
            if WORKSPACES in d:
                modern.append((module, d))
            elif LEGACY_MARKER in d:
                legacy.append((module, d))
        except Exception as exc:
            unreadable.append((module, exc))
            push(child for _, child in _child_modules(module))
    return _Tree(modern, legacy, graph_mark, unreadable)


def te_graph_mark(module: Any) -> str | None:
    """What TE's `make_graphed_callables` left on `module` (an instance attribute that is a function
    of TE's graph module), or None."""
    d = getattr(module, "__dict__", None) or {}
    for name in TE_GRAPH_ATTRS:
        value = d.get(name)
        try:
            if value is None or getattr(value, "__module__", None) != TE_GRAPH_MODULE:
                continue
            function = str(getattr(value, "__qualname__", "?")).rsplit(".", 1)[-1]
        except Exception:  # an odd object under that name is not TE's function
            continue
        return f"{type(module).__name__}.{name} is TE's {function} from make_graphed_callables"
    return None


class _Names:
    """Names of a chunk's modules for skip and error records, as `named_modules()` gives them.

    Worked out only when a record needs one, and without recursion: `named_modules()` recurses, so
    it raises RecursionError on a tree deeper than the recursion limit. One pass stores each
    module's parent link; a name is then put together by following the links up."""

    def __init__(self, index: int, chunk: Any) -> None:
        self.prefix = f"chunk{index}"
        self._chunk = chunk
        self._links: dict[int, tuple[int, str] | None] | None = None

    def _link_all(self) -> dict[int, tuple[int, str] | None]:
        links: dict[int, tuple[int, str] | None] = {}
        stack: list[tuple[Any, tuple[int, str] | None]] = [(self._chunk, None)]
        while stack:  # pre-order, children in order: a shared module keeps its first name
            module, link = stack.pop()
            if id(module) in links:
                continue
            links[id(module)] = link
            stack.extend((child, (id(module), key)) for key, child in reversed(_child_modules(module)))
        return links

    def __call__(self, module: Any) -> str:
        if self._links is None:
            self._links = self._link_all()
        if id(module) not in self._links:
            return f"{self.prefix}.<{type(module).__name__}>"
        keys = []
        link = self._links[id(module)]
        while link is not None:
            parent, key = link
            keys.append(key)
            link = self._links[parent]
        return ".".join([self.prefix, *reversed(keys)])


def _allocated(torch: Any) -> int | None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return sum(cuda.memory_allocated(i) for i in range(cuda.device_count()))


def _nonempty(workspaces: Any) -> bool:
    try:
        return bool(workspaces)
    except Exception:
        return True  # let _clear_module report what is wrong with it


def _count(workspaces: Any) -> int:
    try:
        return len(workspaces)
    except Exception:
        return 0


def _owns_any(d: dict, param_ids: set[int] | None) -> bool:
    if param_ids is None:
        return True
    return any(id(p) in param_ids for p in (d.get("_parameters") or {}).values())


def _process(models: object, clear: bool, strict: bool | None, params: Iterable[Any] | None = None) -> CacheReport:
    # The walk and the accounting allocate a few objects per module and per cache entry (lists
    # growing, one storage object per inner tensor). On a model of a million modules that wakes the
    # cyclic collector again and again, and each pass traverses the tracked objects of the whole
    # process (the model included) to find nothing: nothing made here forms a cycle. So it is off
    # for the call, and only when it was on (a program that turned it off keeps it off).
    if not gc.isenabled():
        return _process_all(models, clear, strict, params)
    gc.disable()
    try:
        return _process_all(models, clear, strict, params)
    finally:
        gc.enable()


def _process_all(models: object, clear: bool, strict: bool | None, params: Iterable[Any] | None) -> CacheReport:
    torch = _torch()
    report = CacheReport(cleared=clear)
    if torch is None:
        return report
    strict = _switches.strict() if strict is None else strict
    before = _allocated(torch) if clear else None
    counted = _Batch()
    param_ids = None if params is None else {id(p) for p in params}
    chunks, refused = as_chunks(models)
    if refused is not None:
        report.skipped.append(Skipped("models", refused))
    for index, chunk in enumerate(chunks):
        names = _Names(index, chunk)
        tree = _walk(chunk)
        for module, exc in tree.unreadable:
            _unreadable(report, names(module), "reading the module", exc)
        modern, legacy = tree.modern, tree.legacy
        if param_ids is not None:
            modern = _owned(modern, param_ids, names, report)
            legacy = _owned(legacy, param_ids, names, report)
        for module, d in legacy:
            if all(d.get(a) is None for a in LEGACY_ATTRS):
                continue  # a TE < 1.8 layer that has cached nothing (yet): nothing left in place
            try:
                held = sizes.storages([d.get(a) for a in LEGACY_ATTRS], torch)
                entries = sum(1 for a in LEGACY_ATTRS if d.get(a) is not None)
            except Exception as exc:
                _unreadable(report, names(module), "reading its TE < 1.8 caches", exc)
                continue
            report.skipped.append(
                Skipped(
                    names(module),
                    "TE < 1.8 cache layout (weight*_fp8): clearing is unsafe, left in place",
                    entries,
                    sum(held.values()),
                )
            )
        try:
            primary_weight_copies(index, modern, torch, report, clear, chunk, tree.graph_mark)
        except Exception as exc:  # the caches below are cleared all the same
            _unreadable(report, names.prefix, "reading its FP8 primary weights", exc)
        live = []
        for module, d in modern:
            workspaces = d[WORKSPACES]
            if workspaces if type(workspaces) is dict else _nonempty(workspaces):  # a dict's truth never raises
                live.append((module, workspaces))
        if not live:
            continue
        try:
            reason = None if _switches.force_with_cuda_graphs() else cuda_graph_reason(chunk, tree.graph_mark)
        except Exception as exc:  # not knowing whether graphs replay into the caches: leave them
            _unreadable(report, names.prefix, "reading its CUDA graph settings", exc)
            continue
        if reason is not None:
            warn_once(
                f"cuda-graphs:{reason}",
                "te_offload_shim: FP8 weight caches left in place because CUDA graphs are on (%s); "
                "set %s=1 if your graphs are re-captured after an offload",
                reason,
                _switches.FORCE_CUDA_GRAPHS,
            )
            report.skipped.append(Skipped(f"chunk{index}", f"CUDA graphs: {reason}", sum(_count(w) for _, w in live)))
            continue
        counted.take(names, live, torch, clear, report)
    counted.account(torch, report)
    if clear and before is not None:
        after = _allocated(torch)
        report.released_bytes = before - after if after is not None else None
    if strict and report.errors:
        raise ShimError("; ".join(report.errors))
    return report


def _unreadable(report: CacheReport, where: str, doing: str, exc: Exception) -> None:
    """One module (or chunk) that could not be read: left alone and reported, the others go on."""
    report.skipped.append(Skipped(where, f"{doing} raised {type(exc).__name__}: {exc}"))
    report.errors.append(f"{where}: {type(exc).__name__}: {exc}")
    warn_once(
        f"unreadable:{doing}:{type(exc).__name__}",
        "te_offload_shim: %s at %s raised %s; its caches are left in place, the other layers are still cleared",
        doing,
        where,
        repr(exc),  # never the exception: a buffering log handler would keep its frames' tensors alive
    )


def _owned(
    found: list[tuple[Any, dict]], param_ids: set[int], names: _Names, report: CacheReport
) -> list[tuple[Any, dict]]:
    owned = []
    for module, d in found:
        try:
            if _owns_any(d, param_ids):
                owned.append((module, d))
        except Exception as exc:
            _unreadable(report, names(module), "reading its parameters", exc)
    return owned


# The fields of a quantized parameter that hold its second-direction copy, by class family
# (transformer_engine/pytorch/tensor/...: Float8Tensor 2.x; MXFP8, Float8Blockwise, NVFP4).
PRIMARY_WEIGHT_COPIES = ("_transpose", "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")
_WHERE_MAX = 16


# TE releases whose modules rebuild a dropped Float8Tensor transpose when it is next needed: from
# 2.4, Linear, LayerNormLinear, LayerNormMLP and GroupedLinear call
# `weight.update_usage(columnwise_usage=True)` on an FP8 weight in backward, which recreates the
# transpose (`_create_transpose`) when it is missing (module/*.py; checked per release by
# tests/test_te_real.py). MXFP8 / blockwise / NVFP4 columnwise data is quantized from the
# high-precision weight, which a primary weight no longer has: never dropped.
TRANSPOSE_REBUILT_FROM = (2, 4)


def _te_release() -> tuple[int, ...]:
    te = sys.modules.get("transformer_engine")
    try:
        return tuple(int(p) for p in str(getattr(te, "__version__", "0")).split(".")[:2])
    except ValueError:
        return (0,)


def primary_weight_copies(
    index: int,
    modules: list[tuple[Any, dict]],
    torch: Any,
    report: CacheReport,
    clear: bool = False,
    chunk: Any = None,
    graph_mark: str | None = None,
) -> None:
    """Count the transpose / columnwise copies that FP8 primary weights of these TE layers carry;
    when clearing, drop Float8Tensor transposes through TE's own `update_usage` where TE rebuilds
    them (TRANSPOSE_REBUILT_FROM), never under CUDA graphs."""
    plain = (torch.Tensor, torch.nn.Parameter)
    usual = {torch.Tensor, torch.nn.Parameter, type(None)}
    may_drop: bool | None = None if clear else False
    for module, d in modules:
        params = d.get("_parameters")
        if not params or usual.issuperset(map(type, params.values())):  # the common case, in C
            continue
        for name, param in params.items():
            if param is None or type(param) in plain:
                continue
            try:
                copies = [getattr(param, f, None) for f in PRIMARY_WEIGHT_COPIES]
                held = sizes.storages([c for c in copies if c is not None], torch)
            except Exception:  # a parameter class we do not know: nothing to say about it
                continue
            if not held:
                continue
            report.primary_weight_params += 1
            fields = "/".join(f for f, c in zip(PRIMARY_WEIGHT_COPIES, copies, strict=True) if c is not None)
            if fields == "_transpose" and may_drop is None:
                may_drop = _te_release() >= TRANSPOSE_REBUILT_FROM and (
                    _switches.force_with_cuda_graphs() or cuda_graph_reason(chunk, graph_mark) is None
                )
            if fields == "_transpose" and may_drop and _drop_transpose(param, report):
                report.primary_weight_cleared += sum(held.values())
                continue
            report.primary_weight_bytes += sum(held.values())
            if len(report.primary_weight_where) < _WHERE_MAX:
                report.primary_weight_where.append(
                    f"chunk{index}:{type(module).__name__}.{name} ({type(param).__name__}.{fields})"
                )


def _drop_transpose(param: Any, report: CacheReport) -> bool:
    try:
        param.update_usage(columnwise_usage=False)  # TE's own API: drops `_transpose`, marks it invalid
        return getattr(param, "_transpose", None) is None
    except Exception as exc:
        text = repr(exc)
        del exc
        report.errors.append(f"dropping a Float8Tensor transpose: {text}")
        warn_once(f"transpose:{text[:40]}", "te_offload_shim: cannot drop an FP8 weight's transpose: %s", text)
        return False


class _Batch:
    """The values popped in one call, with their modules' parameters: their bytes are counted once,
    together, at the end of the call (one pass and one storage table for the whole call, not one
    per module; a storage two entries share counts once). They are held only until then: the
    offload frees memory after the call returns, and they were all alive when it began."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.params: list[Any] = []
        self.owners: list[tuple[Any, int, int]] = []  # (module, first value, end), for error messages
        self.counted: set[int] = set()  # storages counted for earlier modules, when counting module by module

    def add(self, module: Any, values: list[Any], torch: Any, report: CacheReport) -> None:
        start = len(self.values)
        self.values += values
        self.owners.append((module, start, len(self.values)))
        own = module.__dict__.get("_parameters")
        if own:
            self.params += own.values()

    def take(self, names: _Names, live: list[tuple[Any, Any]], torch: Any, clear: bool, report: CacheReport) -> None:
        """Take (and, when clearing, clear) the entries of these modules. A plain dict, the layout of
        every TE release that has one, is read and cleared inline: neither can raise, and this runs
        once per TE layer of the model. Anything else goes the careful way (_clear_module)."""
        values, params, owners = self.values, self.params, self.owners
        entries = modules = 0
        for module, workspaces in live:
            if type(workspaces) is not dict:
                _clear_module(names, module, workspaces, torch, clear, self, report)
                continue
            start = len(values)
            values += workspaces.values()
            owners.append((module, start, len(values)))
            own = module.__dict__.get("_parameters")
            if own:
                params += own.values()
            if clear:
                workspaces.clear()
            entries += len(values) - start
            modules += 1
        report.entries += entries
        report.modules += modules

    def account(self, torch: Any, report: CacheReport) -> None:
        if not self.values:
            return
        try:
            try:
                freed, shared = sizes.count(self.values, self.params, torch)
            except Exception:  # find the module whose values cannot be counted; count the others
                freed = shared = 0
                counted = self.counted
                for module, start, end in self.owners:
                    try:
                        own = (module.__dict__.get("_parameters") or {}).values()
                        f, s = sizes.count(self.values[start:end], own, torch, counted)
                    except Exception as exc:  # accounting must never keep the caches alive:
                        text = repr(exc)  # repr(exc), never the exception: a buffering log handler
                        del exc  # would keep its traceback, whose frames hold the popped values
                        report.errors.append(f"accounting {type(module).__name__}: {text}")
                        warn_once(f"account:{text[:40]}", "te_offload_shim: byte accounting failed: %s", text)
                        continue
                    freed += f
                    shared += s
            report.bytes += freed
            report.bytes_shared += shared
        finally:
            self.values.clear()
            self.params.clear()
            self.owners.clear()


def _clear_module(
    names: _Names,
    module: Any,
    workspaces: Any,
    torch: Any,
    clear: bool,
    counted: _Batch,
    report: CacheReport,
) -> None:
    if not isinstance(workspaces, dict):
        where = names(module)
        reason = f"{WORKSPACES} is a {type(workspaces).__name__}, not a dict"
        warn_once("not-dict", "te_offload_shim: %s at %s; left alone", reason, where)
        report.skipped.append(Skipped(where, reason))
        return
    try:
        values = list(workspaces.values())
        entries = len(values)
    except Exception as exc:
        _unreadable(report, names(module), f"reading {WORKSPACES}", exc)
        return
    counted.add(module, values, torch, report)
    del values
    if clear:
        try:
            if type(workspaces) is dict:
                workspaces.clear()
            else:
                for key in list(workspaces):
                    workspaces.pop(key)
        except Exception as exc:
            where = names(module)
            report.skipped.append(Skipped(where, f"clearing {WORKSPACES} raised {type(exc).__name__}: {exc}", entries))
            report.errors.append(f"{where}: {type(exc).__name__}: {exc}")
            warn_once(
                f"pop:{type(workspaces).__name__}",
                "te_offload_shim: cannot clear %s at %s: %s",
                WORKSPACES,
                where,
                repr(exc),
            )
            return
    report.entries += entries
    report.modules += 1


def clear_fp8_workspaces(
    models: object, *, params: Iterable[Any] | None = None, strict: bool | None = None
) -> CacheReport:
    """Drop TE's cached FP8 weight copies in `models` (a module or a list of chunks).

    With `params`, only the layers owning one of those parameters are cleared. Call it before your
    allocator flush (`torch.cuda.empty_cache()`): the freed blocks otherwise stay in PyTorch's
    cache. TE >= 1.8 rebuilds the caches on the next forward."""
    return _process(models, clear=True, strict=strict, params=params)


def scan(models: object, *, params: Iterable[Any] | None = None) -> CacheReport:
    """The report `clear_fp8_workspaces` would give, changing nothing."""
    return _process(models, clear=False, strict=False, params=params)
