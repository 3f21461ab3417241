"""Where a target's attribute lives, and how it binds; and what an integration may tell the engine
about calls and classes it does not know. Standard library only: `status()` reads it to count our
wrappers without loading wrapt, and the handler reads it at every call.

The engine patches any framework's function or method without knowing the framework. Two things a
framework can do to a patched entry point are declared here by that framework's integration, never
imported by the engine:

- add a keyword argument of its own to the call, which is no parameter of the target and no model
  (Ray's tracing closure passes `_ray_trace_ctx` to actor methods): `ignore_keyword(name)`.
- put something that is not a class where the table names one (a `@ray.remote` class is an
  ActorClass whose user class is inside it): `find_classes_with(finder)`, a function that returns
  the class behind such an object, or None.

And one thing every clearing hands down to te/: a framework's marks of a CUDA-graphed chunk
(`know_cuda_graphs`; Megatron's config switches). integrations/__init__.py tells them, so they are
known before anything of integrations/ can patch a target or arm the flush net.

Registering is idempotent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._reload import kept
from te_offload_shim.te.graphs import TE_ONLY, GraphMarks

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    ClassFinder = Callable[[object], "type | None"]

# Replaced, never edited: read without a lock. What the integrations told, once, when they loaded:
# the wrappers in place read it at every call, so it outlives a reload of this module (`kept`), which
# would otherwise lose Ray's keyword and class finder, and Megatron's graph marks (a graphed chunk
# would then be cleared), until integrations/ itself was reloaded.
ignored_keywords: frozenset[str] = kept(globals(), "ignored_keywords", frozenset)
_class_finders: tuple[ClassFinder, ...] = kept(globals(), "_class_finders", tuple)
_cuda_graphs: GraphMarks = kept(globals(), "_cuda_graphs", lambda: TE_ONLY)


def ignore_keyword(name: str) -> None:
    """Calls of patched targets may carry `name`, which is not a target's own parameter."""
    global ignored_keywords
    ignored_keywords = ignored_keywords | {name}


def find_classes_with(finder: ClassFinder) -> None:
    """`finder(obj)` returns the class behind `obj` where the table names a class, or None."""
    global _class_finders
    if finder not in _class_finders:
        _class_finders = (*_class_finders, finder)


def know_cuda_graphs(marks: GraphMarks) -> None:
    """A framework's marks of a CUDA-graphed chunk, handed to te/ at every clearing."""
    global _cuda_graphs
    _cuda_graphs = marks


def cuda_graphs() -> GraphMarks | None:
    """What a clearing hands te/: the marks told, or None where the user says their graphs are
    re-captured after an offload (`TE_OFFLOAD_SHIM_FORCE_CUDA_GRAPHS=1`: graphs then keep nothing)."""
    return None if _switches.force_with_cuda_graphs() else _cuda_graphs


def owner_of(module: ModuleType, attribute: str) -> tuple[Any, str] | None:
    """The object whose `__dict__` holds the attribute: the module, or the class in the MRO that
    defines the method (so a subclass that inherits it is patched once, on its base). Where the
    module holds no class under that name, an integration may know the class behind it."""
    if "." not in attribute:
        return (module, attribute) if attribute in vars(module) else None
    class_name, method = attribute.split(".", 1)
    found = vars(module).get(class_name)
    # the class an integration finds behind what the module holds (a `@ray.remote` class), if any
    candidates = (finder(found) for finder in _class_finders) if not isinstance(found, type) else (found,)
    cls = next((c for c in candidates if isinstance(c, type)), None)
    if cls is None:
        return None
    return next(((klass, method) for klass in cls.__mro__ if method in vars(klass)), None)


def binding_of(owner: Any, raw: Any) -> str:
    """How the attribute binds: 'function', 'method', 'staticmethod' or 'classmethod'."""
    if issubclass(type(raw), staticmethod):  # type(): a proxy claims the class of what it wraps
        return "staticmethod"
    if issubclass(type(raw), classmethod):
        return "classmethod"
    return "method" if isinstance(owner, type) else "function"
