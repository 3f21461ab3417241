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

from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _registry
from ._offload import make_handler
from ._wrapper import ShimWrapper, is_ours, shim_layers

MODULE = "ray._private.function_manager"
_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")
LOADER_KIND = "ray-loader"
COPY_KIND = "actor-copy"


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
    for patch in _registry.iter_armed("target"):
        if not isinstance(patch.owner, type):
            continue
        original = patch.replacement.__wrapped__
        origin: tuple[str, str] = (original.__module__, original.__qualname__)
        for klass in actor_class.__mro__:
            if klass is patch.owner:
                break
            copy = vars(klass).get(patch.name)
            if copy is None or shim_layers(copy) or _origin(copy) != origin:
                continue
            known = patch.replacement._self_wrapper  # the target's own call handling
            record = _registry.Record(COPY_KIND, klass, patch.name, copy, target=patch.target)
            handler = make_handler(known.target, known.signature, known.kind, record)
            shim = ShimWrapper(copy, handler, record, origin)
            if _registry.add(record, shim, _setter(klass, patch.name, shim)):
                wrapped += 1
    return wrapped


def _setter(owner: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(owner, name, value)


def _after_load(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    actor_class = wrapped(*args, **kwargs)
    try:
        patch_copies(actor_class)
    except Exception as exc:  # never fail an actor's creation
        from ._log import warn_once

        warn_once("ray-actor", "te_offload_shim: could not patch Ray actor class %r: %r", actor_class, exc)
    return actor_class


def _loader_handler(record: _registry.Record) -> Any:
    def handler(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if not record.armed:
            return wrapped(*args, **kwargs)
        return _after_load(wrapped, instance, args, kwargs)

    return handler


def on_import(module: ModuleType) -> None:
    manager = getattr(module, "FunctionActorManager", None)
    if not isinstance(manager, type):
        return
    with _registry.lock:
        for name in _LOADERS:
            current = vars(manager).get(name)
            if current is None or is_ours(current):
                continue
            record = _registry.Record(LOADER_KIND, manager, name, current)
            ref = (manager.__module__, f"{manager.__qualname__}.{name}")
            wrapper = ShimWrapper(current, _loader_handler(record), record, ref)
            _registry.add(record, wrapper, _setter(manager, name, wrapper))
