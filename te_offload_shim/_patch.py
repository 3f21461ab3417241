"""HOW to patch: wrap a target with wrapt, rebind the aliases callers hold, undo it all.

Imported only once a target module has been imported, so wrapt is never loaded in a process that
does not need it. One registry records every patch, for `status()` and `uninstall()`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

import wrapt

from . import _config
from ._offload import make_handler

if TYPE_CHECKING:
    from .targets import Target

_lock = threading.RLock()


def _resolve(module: str, qualname: str) -> Any:
    """Unpickle a wrapped function by reference: whatever the attribute is now."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class ShimWrapper(wrapt.FunctionWrapper):
    """Our wrapper type: recognisable (one layer only) and picklable by reference.

    wrapt's proxies refuse to pickle; Ray pickles what it cannot import by value, so a module-level
    function that is our wrapper must pickle as "import module, get qualname"."""

    def __init__(
        self, wrapped: Any, wrapper: Any, target_name: str, module: str, qualname: str, signature: Any = None
    ) -> None:
        super().__init__(wrapped, wrapper)
        self._self_signature = signature
        self._self_target_name = target_name
        self._self_module_name = module
        self._self_qualname = qualname

    def __reduce_ex__(self, protocol: object) -> tuple[Any, tuple[str, str]]:
        return _resolve, (self._self_module_name, self._self_qualname)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _resolve, (self._self_module_name, self._self_qualname)


def shim_layers(obj: object) -> int:
    """How many of our wrappers are stacked in `obj`, looking through any `__wrapped__` chain."""
    layers = 0
    for _ in range(16):
        if type(obj) is ShimWrapper:
            layers += 1
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
    return layers


class Patch:
    """One applied patch: enough to undo it exactly."""

    __slots__ = ("name", "original", "owner", "target", "wrapper")

    def __init__(self, target: Target, owner: Any, name: str, original: Any, wrapper: Any) -> None:
        self.target = target
        self.owner = owner
        self.name = name
        self.original = original
        self.wrapper = wrapper


_patches: dict[str, list[Patch]] = {}
_states: dict[str, str] = {}


def state(name: str) -> str | None:
    with _lock:
        return _states.get(name)


def patches() -> dict[str, list[Patch]]:
    with _lock:
        return {k: list(v) for k, v in _patches.items()}


def _owner(module: ModuleType, attribute: str) -> tuple[Any, str] | None:
    """The object whose `__dict__` holds the attribute: the module, or the class in the MRO that
    defines the method (so a subclass that inherits it is patched once, on its base)."""
    if "." not in attribute:
        return (module, attribute) if attribute in vars(module) else None
    class_name, method = attribute.split(".", 1)
    cls = vars(module).get(class_name)
    if not isinstance(cls, type):
        # A @ray.remote class is an ActorClass; the user's class is in its modified class's MRO.
        cls = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", None)
        if not isinstance(cls, type):
            return None
    for klass in cls.__mro__:
        if method in vars(klass):
            return klass, method
    return None


def _rebind(old: Any, new: Any) -> None:
    """Point every module global that holds `old` at `new`.

    Patching: `from X import f` made before the patch holds the original. Unpatching: one made
    after it holds the wrapper, whether or not we ever saw that module."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(mod, ModuleType) or not isinstance(d, dict):
            continue
        for key, value in list(d.items()):
            if value is old:
                d[key] = new


def _where_problem(target: Target, signature: inspect.Signature, is_method: bool) -> str | None:
    """A `where` that names no parameter would patch fine and never clear: say so instead."""
    if target.where.parameter(list(signature.parameters), is_method) is not None:
        return None
    return f"models spec {target.where.text or target.where.root!r} names no parameter of {target.attribute}{signature}"


def apply(target: Target, module: ModuleType) -> str:
    """Patch `target` in the freshly imported `module`; returns the state recorded for it."""
    with _lock:
        try:
            result = _apply(target, module)
        except Exception as exc:
            _states[target.name] = f"error: {type(exc).__name__}: {exc}"
            raise
        _states[target.name] = result
        return result


def _apply(target: Target, module: ModuleType) -> str:
    if _config.is_disabled(target.name):
        return "disabled"
    if target.fixed_upstream is not None and target.fixed_upstream(module):
        return "fixed upstream"
    found = _owner(module, target.attribute)
    if found is None:
        return "absent"
    owner, name = found
    current = vars(owner)[name]
    if shim_layers(current):
        return "patched"
    if not callable(current):
        return f"error: {target.attribute} is a {type(current).__name__}, not callable"
    is_method = isinstance(owner, type)
    signature = inspect.signature(current)
    problem = _where_problem(target, signature, is_method)
    if problem:
        return f"error: {problem}"
    handler = make_handler(target, signature, is_method)
    qualname = f"{owner.__qualname__}.{name}" if is_method else name
    origin_module = owner.__module__ if is_method else module.__name__
    wrapper = ShimWrapper(current, handler, target.name, origin_module, qualname, signature)
    patch = Patch(target, owner, name, current, wrapper)
    setattr(owner, name, wrapper)
    if not is_method:
        _rebind(current, wrapper)
    _patches.setdefault(target.name, []).append(patch)
    return "patched"


def unpatch_all() -> int:
    """Restore every original on its owner and on every alias we rebound; returns how many."""
    restored = 0
    with _lock:
        for history in _patches.values():
            for patch in reversed(history):
                if vars(patch.owner).get(patch.name) is patch.wrapper:
                    setattr(patch.owner, patch.name, patch.original)
                    restored += 1
                if not isinstance(patch.owner, type):
                    _rebind(patch.wrapper, patch.original)
        _patches.clear()
        _states.clear()
    return restored
