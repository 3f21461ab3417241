"""HOW the flush net is put in place, and what one flush does with it.

Every offload ends the same way: the weights leave the device, then the allocator is flushed
(`torch.cuda.empty_cache()`). The net wraps that flush, in a process that has imported TE's
PyTorch modules and only there: before the flush runs, every live TE layer whose weights have all
left the device (`te.placement`) has its FP8 weight caches dropped by the table's own clearing
(`te.caches.clear_layers`), whatever function led to the flush. The live layers are noted as TE's
base module class builds them (`te.layers`): its `__init__` is wrapped here, and it is given a
`__setstate__` for the layers made without `__init__` (copies, unpickled layers).

What it patches is data given by `integrations/flush.py`: the flush functions (`module`,
`attribute`) and TE's base class. Each patch is a `registry.Record`, so `uninstall()` puts back
exactly what was there when the net armed (the very function torch defines, or whatever an
application or a device stand-in had put in its place) and points the aliases other modules hold
back at it. A flush function wrapped after us (a profiler) keeps our wrapper inside it: disarmed,
that wrapper calls straight through.

Never in the flush's way: the flush's arguments, return value and exceptions are untouched; the
net's own failures are counted, warned about once and the flush goes on (strict mode raises). A
flush reached again on a thread that is already inside the net (a signal handler that flushes, a
flush inside a clearing, the function the net wrapped calling another flush the net wrapped) goes
straight to the original: one flush is one check. The per-thread mark is set before anything
else, and the only lock the net takes (engine/stats.py's, counting) is taken under that mark, so a
signal handler can never wait for it on the thread that holds it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._hook import namespace
from te_offload_shim._log import describe_error, fail_open, human_bytes, log, warn_once
from te_offload_shim._reload import kept
from te_offload_shim._signals import raised_by_signal_handler
from te_offload_shim.engine import attributes, registry, stats
from te_offload_shim.te import caches, layers, placement

if TYPE_CHECKING:
    from collections.abc import Callable

FLUSH_KIND = "net-flush"  # registry kinds: a wrapped flush function, TE's base class __init__
LAYERS_KIND = "net-layers"

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_MEMORY = os.path.join("torch", "cuda", "memory.py")

_inside = threading.local()  # the flushes in flight on each thread (see `_flush_wrapper`)
# How the arming went, for the net's status row: it says what the wrappers in place are, so it
# outlives a reload of this module (`kept`), as they do. Its figures (layers found, objects frozen)
# are counted in engine/stats.py.
_arming: dict[str, str] = kept(globals(), "_arming", lambda: {"state": "not armed", "detail": ""})


def arm(base_module: Any, base_class: str, flushes: tuple[tuple[str, str], ...], *, te_ready: bool) -> str:
    """Put the net in place: TE's base class `base_class` (in `base_module`) notes each layer it
    builds, and each flush function `(module, attribute)` in `flushes` clears the offloaded layers
    before it runs. `te_ready`: TE's PyTorch package had finished importing, so layers may exist
    already (they are searched for once). Returns the state the net's status row says."""
    if not _switches.net():
        return _set("off", f"{_switches.NET}=0 when TE was imported: torch's flush is left as it is")
    try:
        with registry.lock:
            if not registry.active():
                return _set("not armed", "the shim is not installed")
            base = vars(base_module).get(base_class)
            if not isinstance(base, type):
                return _set("error", f"{base_module.__name__} has no class {base_class}: no layer can be found")
            hooked = _hook_layers(base)
            wrapped = [point for point in flushes if _wrap_flush(*point)]
            found, frozen = layers.find_existing(base) if te_ready and hooked else (0, 0)
            stats.net_armed(found, frozen)  # their one owner: the status row reads them there
            if frozen:
                warn_once(
                    "net:frozen",
                    "te_offload_shim: %d objects frozen by gc.freeze() were not searched for TE layers: a layer "
                    "built before the shim was imported may keep its FP8 caches through an offload. Import the "
                    "shim at start-up, before the heap is frozen (every route of docs/cluster.md does)",
                    frozen,
                )
            if not wrapped and not registry.records(FLUSH_KIND):
                return _set("error", "no flush function to wrap: " + ", ".join(f"{m}.{a}" for m, a in flushes))
            return _set("armed", "wraps " + ", ".join(f"{m}.{a}" for m, a in flushes))
    except Exception as exc:  # the import of TE goes on; status says why the net is not there
        fail_open(exc, "net:arm", "te_offload_shim: the flush net could not be armed: %s", exc)
        return _set("error", f"arming failed: {describe_error(exc)}")


def _set(state: str, detail: str) -> str:
    _arming["state"], _arming["detail"] = state, detail
    return state


def _hook_layers(base: type) -> bool:
    """Wrap `base.__init__`, and give `base` a `__setstate__`, so that each layer is noted: built,
    or made by `copy.deepcopy`, pickle, cloudpickle or `torch.load`, which never run `__init__`
    (`__reduce_ex__` gives `cls.__new__`, then `__setstate__` puts the state back; TE 1.x-2.20's
    base class defines none of its own: nn.Module's runs). False if already hooked."""
    raw = vars(base).get("__init__")
    if raw is None or any(r.replacement is raw for r in registry.records(LAYERS_KIND)):
        return False
    record = registry.Record(LAYERS_KIND, base, "__init__", raw)
    own = vars(base).get("__setstate__", registry.ABSENT)
    restored = registry.Record(LAYERS_KIND, base, "__setstate__", own)

    @functools.wraps(raw)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raw(self, *args, **kwargs)
        if record.armed:
            layers.note(self)

    def __setstate__(self: Any, state: Any) -> None:
        if own is registry.ABSENT:
            super(base, self).__setstate__(state)  # type: ignore[arg-type]
        else:
            own(self, state)
        if restored.armed:
            layers.note(self)

    return registry.add(record, __init__) and registry.add(restored, __setstate__)


def _wrap_flush(module_name: str, attribute: str) -> bool:
    """Wrap the flush function `module_name.attribute` as it is now (and every alias of it); False
    when there is none, or it is ours already."""
    owner = sys.modules.get(module_name)
    d = namespace(owner) if owner is not None else None
    raw = d.get(attribute) if d is not None else None
    if raw is None or not callable(raw) or any(r.replacement is raw for r in registry.records(FLUSH_KIND)):
        return False
    record = registry.Record(FLUSH_KIND, owner, attribute, raw, aliases=True)
    return registry.add(record, _flush_wrapper(raw, record, f"{module_name}.{attribute}"))  # and every alias


def _flush_wrapper(original: Callable[..., Any], record: registry.Record, label: str) -> Callable[..., Any]:
    # `_before_flush`, kept out of TorchDynamo's tracing where it is loaded (TE loads it): a flush
    # called from a `torch.compile`d function then runs the net eagerly at every call (a graph break,
    # as torch's own flush makes), rather than having it traced once into a graph whose guards know
    # nothing of layers offloaded since.
    before = _before_flush
    disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
    if disable is not None:
        try:
            before = disable(_before_flush)
        except Exception:
            pass
    strict, from_signal = _switches.strict, raised_by_signal_handler
    inside = _inside  # held here: at interpreter shutdown the module's globals may be None already

    @functools.wraps(original)  # a callable it cannot copy from fails the arming, which fails open
    def empty_cache(*args: Any, **kwargs: Any) -> Any:
        if not record.armed or getattr(inside, "on", False):
            return original(*args, **kwargs)
        # The per-thread mark is set before anything else and stays set while the original runs: a
        # flush reached from there (an application's wrapper made before TE's import calling torch's
        # function, which the net wrapped apart and rebound) goes straight through. One flush, one check.
        inside.on = True
        try:
            # What this closure holds still works while the interpreter tears modules down (their
            # globals set to None, TorchDynamo's too): whatever fails then, the flush runs. So this is
            # `_log.fail_open`'s rule without `_log` (`_before_flush` follows it; this catches what
            # escapes it at teardown): the application's signal-handler exception and strict mode raise.
            try:
                before(label)
            except Exception as exc:
                try:
                    raising = from_signal(exc) or strict()
                except Exception:
                    raising = False
                if raising:
                    raise
            return original(*args, **kwargs)
        finally:
            inside.on = False

    return empty_cache


def _before_flush(label: str) -> None:
    """Clear the caches of every live TE layer whose weights have left the device. Never raises
    (but in strict mode): the flush runs whatever happens here. The per-thread mark is put back as
    it was found (the wrapper set it; a direct call, the benchmark's, must not leave it set)."""
    was, _inside.on = getattr(_inside, "on", False), True
    try:
        if not (_switches.enabled() and _switches.net()):
            return
        stats.flush_seen()
        undecided: list[Any] = []
        offloaded = placement.offloaded_entries(layers.entries(), undecided=undecided)
        if undecided:  # said, not silent: counted and named in the net's status row
            stats.undecided(undecided)
        if offloaded:
            report = caches.clear_layers(offloaded, graphs=attributes.cuda_graphs(), strict=_switches.strict())
            _cleared(label, report)
    except Exception as exc:
        fail_open(
            exc,
            f"net:{type(exc).__name__}",
            "te_offload_shim: the flush net failed (%s); the flush goes on without it",
            exc,
        )
        stats.net_failed()
    finally:
        _inside.on = was


def _cleared(label: str, report: caches.CacheReport) -> None:
    # FP8 primary weights (fp8_model_init / quantized_model_init) have no workspace entry: what the
    # clearing frees of theirs is each one's transpose (`primary_weight_cleared`, bytes)
    caller = _caller() if stats.freed(report) else ""
    level = stats.count_net(report, caller)
    if level is None:
        return
    what = f"{report.entries} FP8 weight caches ({human_bytes(report.bytes)}) in {report.modules} layers"
    if report.primary_weight_cleared:
        dropped = stats.primary_weights_dropped(report)
        what = f"{what} and {dropped}" if report.entries else dropped
    log(
        level,
        "te_offload_shim: an offload the target table does not know left %s; cleared at %s called from %s",
        what,
        label,
        caller,
    )


def _caller() -> str:
    """`file:line in function` of the code that called the flush: the first frame outside this
    package and torch's own `torch/cuda/memory.py` (whose functions call each other)."""
    try:
        frame: Any = sys._getframe(1)
        start = frame
        # up to our wrapper (`empty_cache` in this file), past a tracing guard
        while frame is not None and (frame.f_code.co_name, frame.f_code.co_filename) != ("empty_cache", __file__):
            frame = frame.f_back
        frame = start if frame is None else frame
        while frame is not None:
            filename = frame.f_code.co_filename
            if not (filename.startswith(_PACKAGE_DIR) or filename.endswith(_TORCH_MEMORY)):
                return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
    except Exception:
        pass
    return "<unknown>"


def arming() -> dict[str, str]:
    """How the net's arming went (state, detail), for its status row; its figures (layers found,
    objects frozen then) are engine/stats.py's."""
    return dict(_arming)


def disarmed() -> None:
    """After uninstall(): the registry has restored the flush and TE's class; the layers noted are
    forgotten (a later install finds them again)."""
    layers.forget_all()
    _set("not armed", "uninstalled")
