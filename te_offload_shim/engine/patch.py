"""HOW to patch a table target: wrap it with our wrapper, rebind the aliases callers hold.

Imported only once a target module has been imported, so wrapt is never loaded in a process that
does not need it. Every patch is a `registry.Record`, which is how it is found and undone.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim.engine import registry
from te_offload_shim.engine.handler import make_handler
from te_offload_shim.engine.wrapper import ShimWrapper, armed_layers, is_ours, shim_layers
from te_offload_shim.integrations.ray import remote_user_class

if TYPE_CHECKING:
    from te_offload_shim.engine.status import TargetState
    from te_offload_shim.integrations.targets import Target

__all__ = ["apply", "owner_of", "shim_layers"]

KIND = "target"


def owner_of(module: ModuleType, attribute: str) -> tuple[Any, str] | None:
    """The object whose `__dict__` holds the attribute: the module, or the class in the MRO that
    defines the method (so a subclass that inherits it is patched once, on its base)."""
    if "." not in attribute:
        return (module, attribute) if attribute in vars(module) else None
    class_name, method = attribute.split(".", 1)
    cls = vars(module).get(class_name)
    if not isinstance(cls, type):
        cls = remote_user_class(cls)
        if cls is None:
            return None
    for klass in cls.__mro__:
        if method in vars(klass):
            return klass, method
    return None


def kind_of(owner: Any, raw: Any) -> str:
    """How the attribute binds: 'function', 'method', 'staticmethod' or 'classmethod'."""
    if issubclass(type(raw), staticmethod):  # type(): a proxy claims the class of what it wraps
        return "staticmethod"
    if issubclass(type(raw), classmethod):
        return "classmethod"
    return "method" if isinstance(owner, type) else "function"


def apply(target: Target, module: ModuleType) -> tuple[TargetState, str]:
    """Patch `target` in the freshly imported `module`; returns the state recorded for it, and for
    an error, why."""
    try:
        with registry.lock:  # one decision per attribute, however many threads import at once
            state, detail = _apply(target, module)
    except Exception as exc:
        state, detail = "error", f"{type(exc).__name__}: {exc}"
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
    kind = kind_of(owner, raw)
    function = raw.__func__ if kind in ("staticmethod", "classmethod") else raw
    if not callable(function):
        return "error", f"{target.attribute} is a {type(raw).__name__}, not callable"
    signature = inspect.signature(function)
    takes_self = kind in ("method", "classmethod")
    if target.where.parameter(list(signature.parameters), takes_self) is None:
        spec = target.where.text or target.where.root
        return "error", f"models spec {spec!r} names no parameter of {target.attribute}{signature}"
    ref = (owner.__module__, f"{owner.__qualname__}.{name}") if isinstance(owner, type) else (module.__name__, name)
    record = registry.Record(KIND, owner, name, raw, target=target.name, aliases=not isinstance(owner, type))
    wrapper = ShimWrapper(raw, make_handler(target, signature, kind, record), record, ref)

    def put_in_place() -> None:
        setattr(owner, name, wrapper)
        if record.aliases:
            registry.rebind(raw, wrapper)

    if not registry.add(record, wrapper, put_in_place):
        return "not installed", ""
    return "patched", ""
