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
(engine/integration_hints.py) when this module loads (the start-up watches `ray` ahead of the
table's modules, so that happens before any target of a module that imports Ray is patched): a class
made with `@ray.remote` is patched through `__ray_metadata__.modified_class`, and Ray's
`_ray_trace_ctx` keyword is not a model argument.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from te_offload_shim._log import warn_once
from te_offload_shim.engine import integration_hints, registry
from te_offload_shim.engine.fail_open import fail_open

# engine.wrapper (and wrapt with it) and the handler are imported inside the functions that wrap:
# the constants and the runtime_env rules here are read by `te-offload-shim status`
# (activation/pth.py), which may not load wrapt.

RAY_HOOK = "te_offload_shim.ray_setup"
# With Ray tracing on, actor methods get this keyword through Ray's tracing closure: not a model argument.
TRACE_CTX_KEYWORD = "_ray_trace_ctx"


def remote_user_class(obj: object) -> type | None:
    """The user's class behind a `@ray.remote` class (an ActorClass: the user's class is in the MRO
    of its modified class), or None for anything else."""
    cls = getattr(getattr(obj, "__ray_metadata__", None), "modified_class", None)
    return cls if isinstance(cls, type) else None


integration_hints.ignore_keyword(TRACE_CTX_KEYWORD)
integration_hints.find_classes_with(remote_user_class)


HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set for the entrypoint of a `ray job submit`

# --- actor classes: the by-value method copies -------------------------------------------------

MODULE = "ray._private.function_manager"
_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")


def _wrap(kind: str, owner: Any, name: str, ref: tuple[str, str], handler: Callable[..., Any], **target: Any) -> bool:
    """Wrap `owner.name` with `handler(record)`'s wrapper, as a registry record of `kind`."""
    from te_offload_shim.engine.wrapper import ShimWrapper

    original = vars(owner)[name]
    record = registry.Record(kind, owner, name, original, **target)
    record.handler = handler(record)
    wrapper = ShimWrapper(original, record.handler, record, ref)
    return registry.add(record, wrapper, lambda: setattr(owner, name, wrapper))


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
                fail_open(exc, "ray-actor", "te_offload_shim: could not patch Ray actor class %r: %r", actor_class, exc)
        return actor_class

    return handler


def on_function_manager_import(module: ModuleType) -> None:
    from te_offload_shim.engine.wrapper import is_ours

    manager = getattr(module, "FunctionActorManager", None)
    if not isinstance(manager, type):
        return
    with registry.lock:
        for name in _LOADERS:
            current = vars(manager).get(name)
            if current is not None and not is_ours(current):
                ref = (manager.__module__, f"{manager.__qualname__}.{name}")
                _wrap("ray-loader", manager, name, ref, _loader_handler)


# --- ray.init: our setup hook in the job's runtime_env --------------------------------------------


def _existing_hook(runtime_env: Any) -> object:
    if not isinstance(runtime_env, dict):
        return None
    hook = runtime_env.get("worker_process_setup_hook")
    if hook is None:
        env_vars = runtime_env.get("env_vars") or {}
        hook = env_vars.get(HOOK_ENV_VAR) if isinstance(env_vars, dict) else None
    return hook


def _submitted_job_env() -> dict[str, Any] | None:
    """The runtime_env of a `ray job submit`, which Ray merges with ray.init's (a clash is an error)."""
    raw = os.environ.get(_JOB_CONFIG_ENV_VAR)
    if not raw:
        return None
    import json

    try:
        env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {"unreadable": True}
    return env if isinstance(env, dict) else {"unreadable": True}


def with_setup_hook(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`ray.init`'s keyword arguments with our hook added to the runtime_env, or unchanged (with a
    log line saying why) when the user or the submitted job already has a hook."""
    from te_offload_shim.integrations import ray_runtime_env  # a driver's, once: not in every worker

    submitted = _submitted_job_env()
    runtime_env = kwargs.get("runtime_env")
    if runtime_env is None:
        job_config = kwargs.get("job_config")
        # ray.init's runtime_env replaces the JobConfig's: start from the JobConfig's so nothing is lost.
        base = getattr(job_config, "runtime_env", None) if submitted is None else None
        runtime_env = dict(base) if isinstance(base, dict) else {}
    elif not isinstance(runtime_env, dict):
        return kwargs
    for source in (runtime_env, submitted):
        hook = _existing_hook(source)
        if hook is None:
            continue
        if not ray_runtime_env.is_ours(hook):
            warn_once(
                "ray-hook-taken",
                "te_offload_shim: the Ray job already has worker_process_setup_hook=%r; not adding %s. "
                "Chain it: call te_offload_shim.ray_setup() first thing in your hook, or set "
                "env_vars VERL_USE_EXTERNAL_MODULES=te_offload_shim (verl) / PYTHONPATH to the sitecustomize "
                "bootstrap (te-offload-shim run).",
                hook,
                RAY_HOOK,
            )
        return kwargs
    if submitted is not None and submitted.get("unreadable"):
        return kwargs
    if swapping := ray_runtime_env.env_swapping(runtime_env, submitted):
        warn_once(
            "ray-hook-env",
            "te_offload_shim: the Ray job's runtime_env sets %s (another Python environment); not adding the "
            "setup hook. Where te_offload_shim is installed there, pass worker_process_setup_hook=%r yourself.",
            ", ".join(swapping),
            RAY_HOOK,
        )
        return kwargs
    new_env = dict(runtime_env)
    new_env["worker_process_setup_hook"] = ray_runtime_env.worker_hook()  # fails open where it cannot import us
    return {**kwargs, "runtime_env": new_env}


def _init_handler(record: registry.Record) -> Callable[..., Any]:
    def handler(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        if record.armed and registry.active():
            try:
                kwargs = with_setup_hook(kwargs)
            except Exception as exc:  # ray.init must go on whatever happens here
                fail_open(exc, "ray-hook-error", "te_offload_shim: could not add the Ray setup hook: %r", exc)
        return wrapped(*args, **kwargs)

    return handler


def on_ray_import(ray: ModuleType) -> None:
    """Post-import callback for `ray`: wrap `ray.init` once (a registry record undoes it)."""
    from te_offload_shim.engine.wrapper import is_ours

    with registry.lock:
        current = vars(ray).get("init")
        if current is not None and not is_ours(current):
            _wrap("ray.init", ray, "init", (ray.__name__, "init"), _init_handler)
