"""HOW to patch a table target: wrap it with our wrapper, rebind the aliases callers hold; and the
import callback that does it for every target of a freshly imported module.

Imported only once a target module has been imported, so wrapt is never loaded in a process that
does not need it. Every patch is a `registry.Record`, which is how it is found and undone
(`registry.add` puts the wrapper in place, and rebinds the aliases a module's function has).
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import TYPE_CHECKING

from te_offload_shim import _log, _switches
from te_offload_shim._signals import raised_by_signal_handler
from te_offload_shim.engine import registry
from te_offload_shim.engine.attributes import binding_of, owner_of
from te_offload_shim.engine.handler import Handler
from te_offload_shim.engine.wrapper import ShimWrapper, armed_layers, is_ours, shim_layers

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target
    from te_offload_shim.engine.states import TargetState

__all__ = ["PATCH_KIND", "ShimWrapper", "apply", "owner_of", "patch_targets_in", "shim_layers"]

PATCH_KIND = "target"  # the registry kind of a table (or user) target's patch


def patch_targets_in(module: ModuleType, targets: tuple[Target, ...]) -> None:
    """Patch every target that lives in `module`; say once of each one that cannot be patched."""
    spec = getattr(module, "__spec__", None)
    name = spec.name if spec is not None else module.__name__
    for target in targets:
        if target.module != name:
            continue
        state, detail = apply(target, module)
        if state == "error" or (state == "absent" and target.user):
            # A target that cannot be patched says so where the operator looks: the log, and status.
            _log.warn_once(
                f"unpatchable:{target.name}",
                "te_offload_shim: %s is not patched (%s); its offload runs without clearing FP8 caches",
                target.path,
                f"error: {detail}" if state == "error" else f"{name} has no attribute {target.attribute}",
            )


def apply(target: Target, module: ModuleType) -> tuple[TargetState, str]:
    """Patch `target` in the freshly imported `module`; returns the state recorded for it, and for
    an error, why."""
    try:
        with registry.lock:  # one decision per attribute, however many threads import at once
            state, detail = _apply(target, module)
    except Exception as exc:
        # Not `_log.fail_open`: a hook never fails an import, strict mode included, and the caller
        # says what failed (once, with the states that are no exception). Only the application's own
        # exception (its signal handler's) goes on: the import callback hands it on, and runs again later.
        if raised_by_signal_handler(exc):
            raise
        state, detail = "error", _log.describe_error(exc)
    registry.set_state(target.name, state, detail)
    return state, detail


def _apply(target: Target, module: ModuleType) -> tuple[TargetState, str]:
    if _switches.is_disabled(target.name):
        return "disabled", ""
    # The module itself, not the installed version number (`fixed_in`, which `status` reads without
    # importing), decides here: a back-port or a git checkout carries the fix under any number.
    if target.fixed_marker is not None and hasattr(module, target.fixed_marker):
        return "fixed upstream", ""
    found = owner_of(module, target.attribute)
    if found is None:
        return "absent", ""
    owner, name = found
    raw = vars(owner)[name]
    if armed_layers(raw):
        return "patched", ""
    if is_ours(raw):  # a disarmed wrapper of an earlier install: patch what it wraps
        raw = raw.__wrapped__
    binding = binding_of(owner, raw)
    function = raw.__func__ if binding in ("staticmethod", "classmethod") else raw
    if not callable(function):
        return "error", f"{target.attribute} is a {type(raw).__name__}, not callable"
    signature = inspect.signature(function)
    ref = (owner.__module__, f"{owner.__qualname__}.{name}") if isinstance(owner, type) else (module.__name__, name)
    record = registry.Record(PATCH_KIND, owner, name, raw, target=target.name, aliases=not isinstance(owner, type))
    record.handler = Handler(target, signature, binding, record)
    if not record.handler.root:
        spec = target.where.text or target.where.root
        return "error", f"models spec {spec!r} names no parameter of {target.attribute}{signature}"
    wrapper = ShimWrapper(raw, record.handler, record, ref)
    if not registry.add(record, wrapper):
        return "not installed", ""
    return "patched", ""
