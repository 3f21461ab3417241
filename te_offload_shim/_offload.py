"""What one wrapped offload call does: find the chunks, clear their caches, count, log, then run
the original (whose own flush hands the memory back to the driver).

Fail open: the shim's own errors are logged once and the original still runs. Strict mode
(`TE_OFFLOAD_SHIM_STRICT=1`) raises them instead, for tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import _config, te_caches
from ._log import human_bytes, log, rank_prefix, warn_once

if TYPE_CHECKING:
    import inspect
    from collections.abc import Callable, Mapping

    from .targets import Target, Where

_RAY_TRACE_CTX = "_ray_trace_ctx"
_lock = threading.Lock()
_inside = threading.local()
_totals: dict[str, Any] = {
    "calls": 0,
    "cleared_calls": 0,
    "entries": 0,
    "modules": 0,
    "bytes": 0,
    "released_bytes": 0,
    "skipped": 0,
    "errors": 0,
    "primary_weight_bytes": 0,  # FP8 primary weights' transpose/columnwise copies seen at the last call
}
_by_target: dict[str, dict[str, int]] = {}
_announced = False


def stats() -> dict[str, Any]:
    with _lock:
        result = dict(_totals)
        result["by_target"] = {k: dict(v) for k, v in _by_target.items()}
        return result


def reset_stats() -> None:
    global _announced
    with _lock:
        for key in _totals:
            _totals[key] = 0
        _by_target.clear()
        _announced = False


def _bind(signature: inspect.Signature, args: tuple, kwargs: dict) -> Mapping[str, Any] | None:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the original raises its own error for this call; we add none
    bound.apply_defaults()
    return bound.arguments


def _locate(where: Where, root: str, call: Mapping[str, Any]) -> Any:
    obj = call.get(root)
    for step, name in enumerate(where.path):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
        if where.call and step == len(where.path) - 1:
            obj = obj()
    return obj


def _record(target: Target, report: te_caches.CacheReport) -> None:
    global _announced
    with _lock:
        _totals["calls"] += 1
        per = _by_target.setdefault(target.name, {"calls": 0, "entries": 0, "bytes": 0})
        per["calls"] += 1
        _totals["skipped"] += len(report.skipped)
        _totals["errors"] += len(report.errors)
        _totals["primary_weight_bytes"] = report.primary_weight_bytes
        if not report.entries:
            return
        _totals["cleared_calls"] += 1
        _totals["entries"] += report.entries
        _totals["modules"] += report.modules
        _totals["bytes"] += report.bytes
        _totals["released_bytes"] += report.released_bytes or 0
        per["entries"] += report.entries
        per["bytes"] += report.bytes
        first, _announced = not _announced, True
    log(
        20 if first else 10,
        "te_offload_shim: %s%s: cleared %d FP8 weight workspaces in %d modules (%s held%s) before the flush",
        rank_prefix(),
        target.path,
        report.entries,
        report.modules,
        human_bytes(report.bytes),
        "" if report.released_bytes is None else f", {human_bytes(report.released_bytes)} released",
    )


def _act(
    target: Target, signature: inspect.Signature, is_method: bool, root: str, instance: Any, args: tuple, kwargs: dict
) -> None:
    full_args = (instance, *args) if is_method and instance is not None else args
    if _RAY_TRACE_CTX in kwargs and _RAY_TRACE_CTX not in signature.parameters:
        # With Ray tracing on, actor methods get this keyword through Ray's tracing closure.
        kwargs = {k: v for k, v in kwargs.items() if k != _RAY_TRACE_CTX}
    call = _bind(signature, full_args, kwargs)
    if call is None:
        return
    if target.when is not None and not target.when(call):
        return
    reason = target.step_aside(call) if target.step_aside is not None else None
    if reason:
        log(10, "te_offload_shim: %s: stepping aside: %s", target.path, reason)
        return
    models = _locate(target.where, root, call)
    if isinstance(models, Iterator):
        warn_once(
            f"iterator:{target.name}",
            "te_offload_shim: %s got its models as a one-shot iterator; caches not cleared "
            "(consuming it would change what the original sees). Pass a list.",
            target.path,
        )
        return
    params = None
    if target.resolve is not None and models is not None:
        models, params = target.resolve(models)
    _record(target, te_caches.clear_fp8_workspaces(models, params=params, strict=_config.strict()))


def make_handler(target: Target, signature: inspect.Signature, is_method: bool) -> Callable[..., Any]:
    """The wrapt wrapper function for `target`."""
    # The patcher refuses a spec that names no parameter, so this is resolved once, here.
    root = target.where.parameter(list(signature.parameters), is_method) or ""

    def handler(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        depth = getattr(_inside, "depth", 0)
        _inside.depth = depth + 1
        try:
            # An offload that calls another patched offload (a subclass calling super(), verl's
            # function reaching Megatron's) was cleared by the outermost wrapper already.
            if depth == 0:
                try:
                    _act(target, signature, is_method, root, instance, args, kwargs)
                except Exception as exc:
                    if _config.strict():
                        raise
                    with _lock:
                        _totals["errors"] += 1
                    warn_once(
                        f"act:{target.name}:{type(exc).__name__}",
                        "te_offload_shim: %s: clearing FP8 caches failed (%r); the offload goes on without it",
                        target.path,
                        exc,
                    )
            return wrapped(*args, **kwargs)
        finally:
            _inside.depth = depth

    return handler
