"""Transformer Engine's cached quantized weights: find them, count their bytes, drop them.

This and the modules beside it are the only place where the shim touches TE internals, and they
know nothing of verl, Ray or wrapt. They read no switch either: the entry that calls them (the API,
the wrapped offload's handler, the flush net) resolves strict mode and the graph marks, so every
entry decides both the same way. Nothing here imports torch or TE: torch is taken from
`sys.modules` (if it is not imported, there is nothing to clear).

A call (`_Call`) keeps no object per layer or per entry that the cyclic collector tracks, only a few
lists and plain ints: on a large model such objects would set off collections of their own
(BENCHMARKS.md, "The clearing walk with the collector on").
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from te_offload_shim._log import describe_error, fail_open, warn_once
from te_offload_shim._switches import FORCE_CUDA_GRAPHS
from te_offload_shim.te import sizes
from te_offload_shim.te.caching_off import count_caching_off
from te_offload_shim.te.chunks import as_chunks
from te_offload_shim.te.graphs import TE_ONLY, GraphMarks, cuda_graph_reason
from te_offload_shim.te.layouts import LEGACY_ATTRS, WORKSPACES
from te_offload_shim.te.primary import primary_weight_copies
from te_offload_shim.te.report import CacheReport, ShimError, Skipped
from te_offload_shim.te.walk import walk

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    Where = Callable[[Any], str]  # a module's name for skip and error records

__all__ = ["CacheReport", "ShimError", "Skipped", "clear_chunks", "clear_fp8_workspaces", "clear_layers", "scan"]


def clear_fp8_workspaces(
    models: object, *, graphs: GraphMarks | None = TE_ONLY, params: Iterable[Any] | None = None, strict: bool = False
) -> CacheReport:
    """Drop TE's cached FP8 weight copies in `models` (a module or a list of chunks).

    `graphs`: a framework's marks of a CUDA-graphed chunk (integrations/ hands them down), besides
    TE's own; None when the user says their graphs are re-captured after an offload (then graphs
    keep nothing). With `params`, only the layers owning one of those parameters are cleared. Call it
    before your allocator flush (`torch.cuda.empty_cache()`): the freed blocks otherwise stay in
    PyTorch's cache. TE >= 1.8 rebuilds the caches on the next forward."""
    return clear_chunks(*as_chunks(models), graphs=graphs, params=params, strict=strict)


def clear_layers(layers: list[Any], *, graphs: GraphMarks | None, strict: bool = False) -> CacheReport:
    """Drop the caches of these TE layers (the flush net's call: no model chunk to start from).

    Each layer is a chunk of its own, so every rule of a chunk holds per layer: a layer whose
    Megatron `config` turns CUDA graphs on, or that carries TE's `make_graphed_callables` marks, is
    left alone; TE < 1.8 caches stay; FP8 primary weights, caching-off reasons and bytes are counted
    as for a table target."""
    return clear_chunks(list(layers), None, graphs=graphs, strict=strict)


def scan(models: object, *, graphs: GraphMarks | None = TE_ONLY, params: Iterable[Any] | None = None) -> CacheReport:
    """The report `clear_fp8_workspaces` would give, changing nothing."""
    return clear_chunks(*as_chunks(models), graphs=graphs, params=params, clear=False)


def clear_chunks(
    chunks: list[Any],
    refused: str | None,
    *,
    graphs: GraphMarks | None,
    params: Iterable[Any] | None = None,
    strict: bool = False,
    clear: bool = True,
) -> CacheReport:
    """`clear_fp8_workspaces` (`scan` with `clear=False`) for chunks already split by
    `chunks.as_chunks` (the wrapped offload's handler splits them once per call); `refused` is why
    `models` was not looked into, if it was not.

    The cyclic collector is left as the application has it. Switching it off for the call spares
    the collections that the walk's allocations trigger on a model of a million modules, but
    switching it back on afterwards would undo an application that turned it off for good meanwhile
    (Megatron's manual GC does, on another thread), and no check can tell the two apart."""
    torch = sys.modules.get("torch")  # None: not imported, so `chunks` is empty (`chunks.as_chunks`)
    report = CacheReport(cleared=clear)
    before = _allocated(torch) if clear else None
    call = _Call(torch, clear, graphs, None if params is None else {id(p) for p in params}, report)
    if refused is not None:
        report.skipped.append(Skipped("models", refused))
    for index, chunk in enumerate(chunks):
        call.chunk(index, chunk)
    call.account()
    if before is not None:
        after = _allocated(torch)
        report.released_bytes = before - after if after is not None else None
    if strict and report.errors:
        raise ShimError("; ".join(report.errors))
    return report


def _allocated(torch: Any) -> int | None:
    """Bytes the CUDA allocator holds for tensors, or None: CUDA not initialised, or its counters
    cannot be read (a half-initialised set-up, a device stand-in). Measuring is a report: it never
    decides whether the caches are cleared."""
    try:
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return None
        return int(sum(cuda.memory_allocated(i) for i in range(cuda.device_count())))
    except Exception:
        return None


def _count(workspaces: Any) -> int:
    try:
        return len(workspaces)
    except Exception:
        return 0


def _unreadable(report: CacheReport, where: str, doing: str, exc: Exception, entries: int = 0) -> None:
    """One module (or chunk) that could not be read or cleared: left alone and reported (with the
    `entries` it keeps, where known), the others go on. The fail-open rule without strict mode: the
    call's entry raises `ShimError` in strict mode, once every other layer is cleared."""
    why = describe_error(exc)
    fail_open(
        exc,
        f"unreadable:{doing}:{type(exc).__name__}",
        "te_offload_shim: %s at %s raised %s; its caches are left in place, the other layers are still cleared",
        doing,
        where,
        why,
        strict=False,
    )
    report.skipped.append(Skipped(where, f"{doing} raised {why}", entries))
    report.errors.append(f"{where}: {why}")


def _names(index: int, chunk: Any) -> Where:
    """A module's name in `chunk` for a record, as `named_modules()` gives it (te/names.py, loaded
    at the first record made: a clearing that meets nothing odd names nothing)."""
    found: list[Where] = []

    def name(module: Any) -> str:
        if not found:
            from te_offload_shim.te.names import Names

            found.append(Names(index, chunk))
        return found[0](module)

    return name


class _Call:
    """One clearing (or scan): what it works with, its report, and the values it popped, with their
    modules' parameters: their bytes are counted once, together, at the end of the call (one pass
    and one storage table for the whole call, not one per module; a storage two entries share counts
    once). They are held only until then: the offload frees memory after the call returns, and they
    were all alive when it began."""

    def __init__(
        self, torch: Any, clear: bool, graphs: GraphMarks | None, param_ids: set[int] | None, report: CacheReport
    ) -> None:
        self.torch, self.clear, self.graphs, self.param_ids, self.report = torch, clear, graphs, param_ids, report
        self.values: list[Any] = []
        self.params: list[Any] = []

    def chunk(self, index: int, chunk: Any) -> None:
        """One chunk: report what cannot be read or is left in place, then take its live workspaces
        (unless CUDA graphs replay into them)."""
        report, torch, graphs = self.report, self.torch, self.graphs
        names = _names(index, chunk)
        tree = walk(chunk, marks=graphs or TE_ONLY)
        for module, exc in tree.unreadable:
            _unreadable(report, names(module), "reading the module", exc)
        modern, modern_dicts, legacy, legacy_dicts = tree.modern, tree.modern_dicts, tree.legacy, tree.legacy_dicts
        if self.param_ids is not None:
            modern, modern_dicts = self._owned(modern, modern_dicts, names)
            legacy, legacy_dicts = self._owned(legacy, legacy_dicts, names)
        self._report_legacy(legacy, legacy_dicts, names)
        # Whether CUDA graphs may replay into this chunk's caches: decided once, for its workspaces and
        # its primary weights' transposes alike (not knowing counts as graphed: what it reads is kept)
        try:
            graphed: str | Exception | None = (
                None if graphs is None else cuda_graph_reason(chunk, tree.graph_mark, graphs)
            )
        except Exception as exc:
            graphed = exc
        try:
            primary_weight_copies(
                index, zip(modern, modern_dicts, strict=True), torch, report, self.clear and graphed is None
            )
        except Exception as exc:  # the caches below are cleared all the same
            _unreadable(report, f"chunk{index}", "reading its FP8 primary weights", exc)
        live, workspaces = self._live(modern, modern_dicts)
        if live and not self._graphed(index, graphed, workspaces):
            self.collect_entries(names, live, workspaces)

    def _owned(self, found: list[Any], dicts: list[dict], names: Where) -> tuple[list[Any], list[dict]]:
        """The modules of `found` (and their dicts) that own one of the call's parameters."""
        owned: list[Any] = []
        owned_dicts: list[dict] = []
        param_ids = self.param_ids or set()
        for module, d in zip(found, dicts, strict=True):
            try:
                if any(id(p) in param_ids for p in (d.get("_parameters") or {}).values()):
                    owned.append(module)
                    owned_dicts.append(d)
            except Exception as exc:
                _unreadable(self.report, names(module), "reading its parameters", exc)
        return owned, owned_dicts

    def _report_legacy(self, legacy: list[Any], dicts: list[dict], names: Where) -> None:
        """TE < 1.8 layers that cached something: left in place (clearing them is unsafe), reported."""
        for module, d in zip(legacy, dicts, strict=True):
            held = [d.get(a) for a in LEGACY_ATTRS]
            if all(h is None for h in held):
                continue  # a TE < 1.8 layer that has cached nothing (yet): nothing left in place
            try:
                nbytes = sum(sizes.storages(held, self.torch).values())
            except Exception as exc:
                _unreadable(self.report, names(module), "reading its TE < 1.8 caches", exc)
                continue
            reason = "TE < 1.8 cache layout (weight*_fp8): clearing is unsafe, left in place"
            self.report.skipped.append(Skipped(names(module), reason, sum(h is not None for h in held), nbytes))

    def _live(self, modern: list[Any], dicts: list[dict]) -> tuple[list[Any], list[Any]]:
        """The TE >= 1.8 layers whose workspaces hold something, and those workspaces (position by
        position); of the empty ones, those whose caching is off by configuration are counted by reason."""
        live: list[Any] = []
        held: list[Any] = []
        keep, keep_held = live.append, held.append
        for module, d in zip(modern, dicts, strict=True):
            workspaces = d[WORKSPACES]
            try:
                held_any = bool(workspaces)
            except Exception:  # not TE's plain dict: let clear_module report what is wrong with it
                held_any = True
            if held_any:
                keep(module)
                keep_held(workspaces)
            else:
                count_caching_off(d, self.report.caching_off)
        return live, held

    def _graphed(self, index: int, reason: str | Exception | None, workspaces: list[Any]) -> bool:
        """Whether this chunk's caches stay because CUDA graphs may replay into them (said once, and
        reported); also when its graph settings could not be read (`reason` is what reading raised)."""
        if isinstance(reason, Exception):
            _unreadable(self.report, f"chunk{index}", "reading its CUDA graph settings", reason)
            return True
        if reason is None:
            return False
        warn_once(
            f"cuda-graphs:{reason}",
            "te_offload_shim: FP8 weight caches left in place because CUDA graphs are on (%s); "
            "set %s=1 if your graphs are re-captured after an offload",
            reason,
            FORCE_CUDA_GRAPHS,
        )
        self.report.skipped.append(Skipped(f"chunk{index}", f"CUDA graphs: {reason}", sum(map(_count, workspaces))))
        return True

    def add(self, module: Any, values: Any) -> None:
        self.values += values
        own = module.__dict__.get("_parameters")
        if own:
            self.params += own.values()

    def collect_entries(self, where: Where, live: list[Any], workspaces: list[Any]) -> None:
        """Collect (and, when clearing, clear) the entries of these modules (`workspaces[i]` is
        `live[i]`'s). A plain dict, the layout of every TE release that has one, is read and
        cleared inline: neither can raise, and this runs once per TE layer of the model. Anything
        else goes the careful way (`clear_module`). `where` names a module for the records."""
        add, clear = self.add, self.clear
        entries = modules = 0
        for module, held in zip(live, workspaces, strict=True):
            if type(held) is not dict:
                self.clear_module(where, module, held)
                continue
            entries += len(held)
            add(module, held.values())
            if clear:
                held.clear()
            modules += 1
        self.report.entries += entries
        self.report.modules += modules

    def clear_module(self, where: Where, module: Any, workspaces: Any) -> None:
        """One TE layer's `workspaces` (its `_fp8_workspaces`, whatever it is), the careful way: taken
        (`account` counts their bytes) and, when clearing, emptied; anything that raises is reported
        for this layer alone. Needs no chunk: `where(module)` names it in records."""
        report = self.report
        if not isinstance(workspaces, dict):
            name = where(module)
            reason = f"{WORKSPACES} is a {type(workspaces).__name__}, not a dict"
            warn_once("not-dict", "te_offload_shim: %s at %s; left alone", reason, name)
            report.skipped.append(Skipped(name, reason))
            return
        try:
            values = list(workspaces.values())
        except Exception as exc:
            _unreadable(report, where(module), f"reading {WORKSPACES}", exc)
            return
        self.add(module, values)
        if self.clear:
            try:  # a dict subclass (a plain dict is cleared in `collect_entries`): key by key, through its own pop
                for key in list(workspaces):
                    workspaces.pop(key)
            except Exception as exc:
                _unreadable(report, where(module), f"clearing {WORKSPACES}", exc, len(values))
                return
        report.entries += len(values)
        report.modules += 1

    def account(self) -> None:
        """Count the bytes of every value taken, then let go of them. Accounting never keeps the
        caches alive: what fails is reported as text (`describe_error`), never as the exception,
        whose traceback's frames hold the values; the call's bytes are then not counted (its error
        says why), and the caches are cleared all the same."""
        if not self.values:
            return
        try:
            freed, shared = sizes.count(self.values, self.params, self.torch)
            self.report.bytes += freed
            self.report.bytes_shared += shared
        except Exception as exc:
            key = f"account:{type(exc).__name__}"
            fail_open(exc, key, "te_offload_shim: byte accounting failed: %s", exc, strict=False)
            self.report.errors.append(f"accounting the caches' bytes: {describe_error(exc)}")
        finally:
            self.values.clear()
            self.params.clear()
