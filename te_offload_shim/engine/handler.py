"""What one wrapped offload call does: find the chunks, clear their caches, count, log, then run
the original (whose own flush hands the memory back to the driver).

Fail open: the shim's own errors are logged once and the original still runs, whatever happens
here (a raising logging handler included). Strict mode (`TE_OFFLOAD_SHIM_STRICT=1`) raises them
instead, for tests. The switches are read at every call: `TE_OFFLOAD_SHIM=0` or a name in
`TE_OFFLOAD_SHIM_DISABLE` set in a running process leaves the next offload alone.
"""

from __future__ import annotations

import sys
import threading
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._locks import held_here
from te_offload_shim._log import describe_error, fail_open, human_bytes, log, warn_once
from te_offload_shim.engine import attributes, stats
from te_offload_shim.te import caches
from te_offload_shim.te.caching_off import describe
from te_offload_shim.te.chunks import as_chunks

if TYPE_CHECKING:
    import inspect
    from collections.abc import Callable, Mapping

    from te_offload_shim.engine.registry import Record
    from te_offload_shim.engine.schema import Target

# The calls in flight on each thread (`Handler.__call__`); the counters are engine/stats.py's.
_inside = threading.local()


def _left_alone(target: Target, reason: str, nested: bool) -> None:
    """A call the target's skip rule left alone: counted under its reason, logged at debug level
    (a skip is expected behaviour, and an offload can run every step). Not a call inside another
    wrapped call (`nested`): the outer one is what counts."""
    if not nested:
        stats.left_alone(target.name, reason)
        log(10, "te_offload_shim: %s: left alone: %s", target.path, reason)


def _count_clearing(target: Target, report: caches.CacheReport) -> None:
    level = stats.count_table(target.name, report)
    if level is not None and stats.freed(report):
        done = []
        if report.entries:
            released = "" if report.released_bytes is None else f", {human_bytes(report.released_bytes)} released"
            held = f"{human_bytes(report.bytes)} held{released}"
            done.append(f"cleared {report.entries} FP8 weight workspaces in {report.modules} modules ({held})")
        if report.primary_weight_cleared:  # FP8 primary weights have no entry: their transposes are what it freed
            done.append(f"dropped {stats.primary_weights_dropped(report)}")
        log(level, "te_offload_shim: %s: %s before the flush", target.path, " and ".join(done))
    elif level is not None:  # a 0 that is no clearing's doing says why, once per reason at the first line's level
        log(
            level,
            "te_offload_shim: %s: nothing to clear: FP8 weight caching is off by configuration in %s",
            target.path,
            describe(report.caching_off),
        )


class Handler:
    """The wrapt wrapper function of one patched target: what it knows about the target's call
    (signature, how it binds, where the models are) is worked out once, here."""

    __slots__ = ("binding", "record", "root", "signature", "takes_self", "target")

    def __init__(self, target: Target, signature: inspect.Signature, binding: str, record: Record) -> None:
        self.target = target
        self.signature = signature
        self.binding = binding  # how the attribute binds: function, method, staticmethod, classmethod
        self.record = record
        self.takes_self = binding in ("method", "classmethod")
        # The patcher refuses a spec that names no parameter, so this is resolved once, here.
        self.root = target.where.parameter(list(signature.parameters), self.takes_self) or ""

    def __call__(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict, _finalizing=sys.is_finalizing
    ) -> Any:
        # A wrapped call has one frame more than the original, this one (as under any wrapper):
        # pytest and IPython leave a frame out of the tracebacks they print when it sets this.
        __tracebackhide__ = True
        # At interpreter shutdown (a `__del__` that offloads) the modules' globals are being set to
        # None, this one's and those it reads: the shim steps aside (`_finalizing` is bound here, on
        # the function, for that reason). So it does when disarmed.
        if _finalizing() or not self.record.armed:
            return wrapped(*args, **kwargs)
        inside = _inside
        # Code that interrupted the shim's own on this thread (a signal handler that offloads, a
        # `__del__` the collector runs) finds the package's state half-updated, and a lock of it
        # held: it runs the original alone. Inside the original, a patched offload it calls is no
        # interruption (`busy` is off there).
        if getattr(inside, "busy", False) or held_here():
            return wrapped(*args, **kwargs)
        depth = getattr(inside, "depth", 0)
        covered: frozenset[int] = getattr(inside, "covered", _NONE)
        try:
            inside.busy = True
            inside.depth = depth + 1
            # An offload that calls another patched offload (SkyRL's function reaching megatron-core's
            # buffer offload, a subclass calling super()): the inner wrapper clears only the chunks
            # that no wrapper outside it cleared. Only a clearing that ran counts: a target switched
            # off, left alone by its skip rule, failing, or whose spec finds nothing covers nothing,
            # so adding or disabling a target never clears less than not having it.
            models, cleared = self._clear_failing_open(instance, args, kwargs, covered, depth > 0)
            if cleared:
                inside.covered = covered | cleared
            pending = None
            if depth == 0 and _switches.audit():  # TE_OFFLOAD_SHIM_AUDIT: what the offload leaves on the device
                from te_offload_shim.reports import audit  # loaded only where the audit is on

                # a call left alone (or the shim off) has its chunks found for the audit, by the audit
                pending = audit.begin(self.target, models, lambda: self._models(instance, args, kwargs))
            inside.busy = False
            result = wrapped(*args, **kwargs)
            if pending is not None:
                inside.busy = True
                pending.finish(stats.count_audit)  # never raises
            return result
        finally:
            inside.busy = False
            inside.depth = depth
            inside.covered = covered

    def _clear_failing_open(
        self, instance: Any, args: tuple, kwargs: dict, covered: frozenset[int], nested: bool
    ) -> tuple[Any, frozenset[int]]:
        """Clear this call's caches; returns the model chunks it found (None if it found none) and
        the ids of the chunks it cleared."""
        try:
            if _switches.enabled() and not _switches.is_disabled(self.target.name):
                return self._clear(instance, args, kwargs, covered, nested)
        except Exception as exc:
            # raises the application's own exception (a timeout its SIGALRM handler raised); strict mode too
            fail_open(
                exc,
                f"act:{self.target.name}:{type(exc).__name__}",
                "te_offload_shim: %s: clearing FP8 caches failed (%s); the offload goes on without it",
                self.target.path,
                exc,
            )
            stats.clearing_failed(self.target.name, describe_error(exc))
        return None, _NONE

    def _models(self, instance: Any, args: tuple, kwargs: dict) -> Any:
        """The model chunks of a call, bound afresh (None where it does not bind); may raise."""
        call = self._bind(instance, args, kwargs)
        return self._chunks(call)[0] if call is not None else None

    def _bind(self, instance: Any, args: tuple, kwargs: dict) -> Mapping[str, Any] | None:
        # wrapt hands over the instance of every bound call: a method's, and a patched function's
        # that a class holds as an attribute (the function then gets it first, as `self`)
        if instance is not None:
            args = (instance, *args)
        ignored = attributes.ignored_keywords  # keywords a framework adds (Ray's tracing): no model argument
        if ignored and not ignored.isdisjoint(kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k not in ignored or k in self.signature.parameters}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None  # the original raises its own error for this call; we add none
        bound.apply_defaults()
        return bound.arguments

    def _locate(self, call: Mapping[str, Any]) -> Any:
        where = self.target.where
        obj = call.get(self.root)
        for step, name in enumerate(where.path):
            holder, obj = obj, getattr(obj, name, _ABSENT)
            if obj is _ABSENT:
                if self.target.user:  # the user's own spec: a wrong one must not stay silent
                    warn_once(
                        f"spec-finds-nothing:{self.target.name}",
                        "te_offload_shim: %s: models spec %r finds nothing (%s has no attribute %r); "
                        "nothing is cleared at this call",
                        self.target.path,
                        where.text,
                        type(holder).__name__,
                        name,
                    )
                return None
            if obj is None:
                return None
            if where.call and step == len(where.path) - 1:
                if not _written_in_python(obj):
                    raise NotCalled(
                        f"models spec {where.text!r}: {name} is a {type(obj).__name__}, not a method written in "
                        "Python (a built-in such as list.clear): not called, nothing cleared"
                    )
                obj = obj()
        return obj

    def _chunks(self, call: Mapping[str, Any]) -> tuple[Any, Any]:
        """(model chunks, parameters to limit the clearing to) of a bound call."""
        models = self._locate(call)
        if self.target.resolve is not None and models is not None:
            return self.target.resolve(models)
        return models, None

    def _clear(
        self, instance: Any, args: tuple, kwargs: dict, covered: frozenset[int], nested: bool
    ) -> tuple[Any, frozenset[int]]:
        target = self.target
        call = self._bind(instance, args, kwargs)
        if call is None:
            return None, _NONE
        reason = target.skip(call) if target.skip is not None else None
        if reason:
            _left_alone(target, reason, nested)
            return None, _NONE
        try:
            models, params = self._chunks(call)
        except NotCalled as refused_call:
            _left_alone(target, str(refused_call), nested)
            warn_once(f"not-called:{target.name}", "te_offload_shim: %s: %s", target.path, refused_call)
            return None, _NONE
        chunks, refused = as_chunks(models)
        if refused is None and covered:
            chunks = [c for c in chunks if id(c) not in covered]
            if not chunks:
                return models, _NONE  # every chunk of it was cleared by a wrapper outside this call
            models = chunks
        # The chunks are split once per call, here: the clearing takes them as they are.
        report = caches.clear_chunks(
            chunks, refused, graphs=attributes.cuda_graphs(), params=params, strict=_switches.strict()
        )
        _count_clearing(target, report)
        if _switches.te_globals():  # opt-in: TE's re-creatable globals too, after the caches
            _give_back_te_globals(report)
        # A clearing limited to some layers (megatron-core's: one buffer's) covers no whole chunk.
        return models, frozenset(id(c) for c in chunks) if params is None else _NONE


def _give_back_te_globals(report: caches.CacheReport) -> None:
    """TE_OFFLOAD_SHIM_TE_GLOBALS: TE's re-creatable process globals given back after the clearing
    (`report`), counted, and the first giving back said at INFO."""
    from te_offload_shim.te import process_globals  # loaded only where it is asked for

    given = process_globals.give_back(report)
    level = stats.count_te_globals(given) if given is not None else None
    if level is not None and given is not None:
        what = f"{given.entries} tensors, {human_bytes(given.bytes)}"
        log(level, "te_offload_shim: gave back TE's %s: %s", process_globals.DUMMY_WGRADS, what)


_NONE: frozenset[int] = frozenset()
_ABSENT = object()


class NotCalled(Exception):
    """A `where` spec's final call that the handler refuses to make, and why."""


def _written_in_python(obj: object) -> bool:
    # The one call a spec may make is a method (or function) written in Python: a getter such as
    # ROLL's `get_models()`. A built-in found there (`list.clear`, `dict.popitem`) changes what it is
    # called on: the parse already refuses dunder and private steps, this is the run-time half.
    cls = type(obj)
    if cls is MethodType:
        return type(obj.__func__) is FunctionType  # type: ignore[attr-defined]
    return cls is FunctionType
