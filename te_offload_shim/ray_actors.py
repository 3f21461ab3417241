"""Patched methods inside Ray actors.

`@ray.remote` builds a subclass and copies every method into it, each wrapped in a tracing closure
that holds the function as it was when the decorator ran (ray.util.tracing.tracing_helper
`_inject_tracing_into_class`, ray 2.60). That class is pickled by value, copies included, so the
actor process runs copies of the originals even where the shim has patched the real class.

In the worker, Ray loads the class in `FunctionActorManager._load_actor_class_from_gcs` (or
`_from_local`) and only then builds the method executors. We wrap those two loaders and, on the
class they return, wrap every copy of a method we patched: a copy is recognised by its module and
qualified name (the `__wrapped__` chain of the tracing closure ends in the copied function).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import wrapt

from . import _patch
from ._offload import make_handler

MODULE = "ray._private.function_manager"
_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")
_lock = threading.Lock()
_wrapped: list[tuple[type, str, Any]] = []


def _origin(fn: Any) -> tuple[str | None, str | None]:
    for _ in range(16):
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def patch_copies(actor_class: Any) -> int:
    """Wrap, in `actor_class` and its bases, every copy of a method the shim has patched."""
    if not isinstance(actor_class, type):
        return 0
    wrapped = 0
    for history in _patch.patches().values():
        for patch in history[-1:]:
            if not isinstance(patch.owner, type):
                continue
            origin: tuple[str, str] = (patch.original.__module__, patch.original.__qualname__)
            for klass in actor_class.__mro__:
                if klass is patch.owner:
                    break
                copy = vars(klass).get(patch.name)
                if copy is None or _patch.shim_layers(copy) or _origin(copy) != origin:
                    continue
                handler = make_handler(patch.target, patch.wrapper._self_signature, True)
                shim = _patch.ShimWrapper(copy, handler, patch.target.name, *origin, patch.wrapper._self_signature)
                setattr(klass, patch.name, shim)
                wrapped += 1
    return wrapped


def _after_load(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    actor_class = wrapped(*args, **kwargs)
    try:
        patch_copies(actor_class)
    except Exception as exc:  # never fail an actor's creation
        from ._log import warn_once

        warn_once("ray-actor", "te_offload_shim: could not patch Ray actor class %r: %r", actor_class, exc)
    return actor_class


def on_import(module: ModuleType) -> None:
    manager = getattr(module, "FunctionActorManager", None)
    if not isinstance(manager, type):
        return
    with _lock:
        for name in _LOADERS:
            current = vars(manager).get(name)
            if current is None or isinstance(current, wrapt.FunctionWrapper):
                continue
            setattr(manager, name, wrapt.FunctionWrapper(current, _after_load))
            _wrapped.append((manager, name, current))


def restore() -> None:
    with _lock:
        for owner, name, original in reversed(_wrapped):
            setattr(owner, name, original)
        _wrapped.clear()
