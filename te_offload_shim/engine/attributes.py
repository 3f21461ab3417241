"""Where a target's attribute lives, and how it binds. Standard library only: `status()` reads it
to count our wrappers without loading wrapt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_offload_shim.engine import integration_hints

if TYPE_CHECKING:
    from types import ModuleType


def owner_of(module: ModuleType, attribute: str) -> tuple[Any, str] | None:
    """The object whose `__dict__` holds the attribute: the module, or the class in the MRO that
    defines the method (so a subclass that inherits it is patched once, on its base). Where the
    module holds no class under that name, an integration may know the class behind it (integration_hints)."""
    if "." not in attribute:
        return (module, attribute) if attribute in vars(module) else None
    class_name, method = attribute.split(".", 1)
    cls = vars(module).get(class_name)
    if not isinstance(cls, type):
        cls = integration_hints.class_behind(cls)
        if cls is None:
            return None
    for klass in cls.__mro__:
        if method in vars(klass):
            return klass, method
    return None


def binding_of(owner: Any, raw: Any) -> str:
    """How the attribute binds: 'function', 'method', 'staticmethod' or 'classmethod'."""
    if issubclass(type(raw), staticmethod):  # type(): a proxy claims the class of what it wraps
        return "staticmethod"
    if issubclass(type(raw), classmethod):
        return "classmethod"
    return "method" if isinstance(owner, type) else "function"
