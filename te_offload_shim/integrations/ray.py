"""Ray: the job's workers, and the method copies inside Ray actors.

Workers. Where the shim is installed, `ray.init` gains a `worker_process_setup_hook` in its
runtime_env, so every worker of the job, on every node, installs the shim before it runs a task.
We stay out when the job already has a hook (Ray allows one), or when its runtime_env installs
another Python environment. The hook fails open in a worker that cannot import the package
(integrations/ray_runtime_env.py).

Actor copies. `@ray.remote` builds a subclass and copies every method into it, each wrapped in a
tracing closure that holds the function as it was when the decorator ran (ray.util.tracing.
tracing_helper `_inject_tracing_into_class`, ray 2.60). That class is pickled by value, copies
included, so the actor process runs copies of the originals even where the shim has patched the
real class. In the worker, Ray loads the class in `FunctionActorManager._load_actor_class_from_gcs`
(or `_from_local`) and only then builds the method executors. We wrap those two loaders and, on the
class they return, wrap every copy of a method we patched: a copy is recognised by its module and
qualified name (the `__wrapped__` chain of the tracing closure ends in the copied function).

What Ray does to a patched entry point, told to the engine through its integration hints
(engine/attributes.py) when this module loads (the start-up watches `ray` ahead of the
table's modules, so that happens before any target of a module that imports Ray is patched): a class
made with `@ray.remote` is patched through `__ray_metadata__.modified_class`, and Ray's
`_ray_trace_ctx` keyword is not a model argument.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from te_offload_shim._log import fail_open
from te_offload_shim.engine import attributes, registry

# engine.wrapper (and wrapt with it) and the handler are imported inside the functions that wrap.

# With Ray tracing on, actor methods get this keyword through Ray's tracing closure: not a model argument.
TRACE_CTX_KEYWORD = "_ray_trace_ctx"


def remote_user_class(obj: object) -> type | None:
    """The user's class behind a `@ray.remote` class (an ActorClass: the user's class is in the MRO
    of its modified class), or None for anything else."""
    cls = getattr(getattr(obj, "__ray_metadata__", None), "modified_class", None)
    return cls if isinstance(cls, type) else None


attributes.ignore_keyword(TRACE_CTX_KEYWORD)
attributes.find_classes_with(remote_user_class)


# --- actor classes: the by-value method copies -------------------------------------------------

_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")


def _wrap(kind: str, owner: Any, name: str, ref: tuple[str, str], handler: Callable[..., Any], **target: Any) -> bool:
    """Wrap `owner.name` with `handler(record)`'s wrapper, as a registry record of `kind`; False (and
    nothing done) where the owner has no such attribute of its own, or holds our wrapper there already."""
    from te_offload_shim.engine.wrapper import ShimWrapper, is_ours

    original = vars(owner).get(name)
    if original is None or is_ours(original):
        return False
    record = registry.Record(kind, owner, name, original, **target)
    record.handler = handler(record)
    return registry.add(record, ShimWrapper(original, record.handler, record, ref))


def patch_copies(actor_class: Any) -> int:
    """Wrap, in `actor_class` and its bases, every copy of a method the shim has patched."""
    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.patch import PATCH_KIND
    from te_offload_shim.engine.wrapper import origin, shim_layers

    if not isinstance(actor_class, type):
        return 0
    wrapped = 0
    for patch in registry.records(PATCH_KIND):
        if not patch.armed or not isinstance(patch.owner, type):
            continue
        known = patch.handler  # the target's own call handling
        ref = origin(patch.original)
        for klass in actor_class.__mro__:
            if klass is patch.owner:
                break
            copy = vars(klass).get(patch.name)
            if copy is None or shim_layers(copy) or origin(copy) != ref:
                continue
            handler = functools.partial(Handler, known.target, known.signature, known.binding)
            wrapped += _wrap("actor-copy", klass, patch.name, ref, handler, target=patch.target)
    return wrapped


def _loader_handler(record: registry.Record) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        actor_class = wrapped(*args, **kwargs)
        if record.armed:
            try:
                patch_copies(actor_class)
            except Exception as exc:  # never fail an actor's creation
                fail_open(exc, "ray-actor", "te_offload_shim: could not patch Ray actor class %r: %s", actor_class, exc)
        return actor_class

    return handler


def on_function_manager_import(module: ModuleType) -> None:
    manager = getattr(module, "FunctionActorManager", None)
    if not isinstance(manager, type):
        return
    with registry.lock:
        for name in _LOADERS:
            ref = (manager.__module__, f"{manager.__qualname__}.{name}")
            _wrap("ray-loader", manager, name, ref, _loader_handler)


# --- ray.init: our setup hook in the job's runtime_env (integrations/ray_runtime_env.py) ---------


def _init_handler(record: registry.Record) -> Callable[..., Any]:
    def handler(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        if record.armed and registry.active():
            try:
                from te_offload_shim.integrations import ray_runtime_env  # a driver's, once: not in every worker

                kwargs = ray_runtime_env.with_setup_hook(kwargs)
            except Exception as exc:  # ray.init must go on whatever happens here
                fail_open(exc, "ray-hook-error", "te_offload_shim: could not add the Ray setup hook: %s", exc)
        return wrapped(*args, **kwargs)

    return handler


def on_ray_import(ray: ModuleType) -> None:
    """Post-import callback for `ray`: wrap `ray.init` once (a registry record undoes it)."""
    with registry.lock:
        _wrap("ray.init", ray, "init", (ray.__name__, "init"), _init_handler)
