"""Ray: the setup hook the shim adds to a job's runtime_env, safe whether or not the workers can
import the package.

Ray imports a `worker_process_setup_hook` given by name in every worker before its first task and
kills the worker when that fails (a job that works without the shim would die with it). So the hook
we add is a function that Ray ships by value (cloudpickle), loading nothing of ours:
activation/ray_worker.py's `setup_worker`, which imports the package in the worker and, where it
cannot (a `PYTHONPATH` in `env_vars` without us, a cluster started without the driver's path, a
package found only in the driver's folder, an actor's own runtime_env), says so in one line and
lets the worker go on without the shim.

One case stays out: a runtime_env that gives the workers another Python environment (`ENV_SWAPPING`),
which may be another Python release, where a function pickled by value (its code object) need not
load at all.

Here too: the rules for adding the hook to `ray.init`'s runtime_env (`with_setup_hook`), a driver's
concern, never loaded in a worker. Standard library only; imported when the shim wraps a `ray.init`
call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from te_offload_shim._log import warn_once

# runtime_env fields that give the workers another Python environment
ENV_SWAPPING = ("pip", "conda", "uv", "container", "image_uri", "py_executable")
RAY_HOOK = "te_offload_shim.ray_setup"
HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
# the name Ray shows for our hook (runtime_env["worker_process_setup_hook"] once uploaded)
HOOK_NAME = "te_offload_shim_ray_setup"


def env_swapping(*envs: Mapping[str, Any] | None) -> list[str]:
    """The fields of the runtime_envs (ray.init's, a submitted job's: Ray merges them) that give the
    workers another Python environment."""
    return [key for key in ENV_SWAPPING if any(isinstance(env, Mapping) and env.get(key) for env in envs)]


# The hook's code lives in activation/ray_worker.py, a module of the layer that may import the
# package; it is read here as source, not imported: it is the program every worker runs, and this
# module (below the package's start-up module) never imports the package itself.
_HOOK_SOURCE = Path(__file__).resolve().parent.parent / "activation" / "ray_worker.py"


@functools.cache
def worker_hook() -> Callable[[], None]:
    """The setup hook for `ray.init`'s runtime_env: activation/ray_worker.py's `setup_worker`,
    compiled into a module namespace of its own (`HOOK_NAME`, no module of `sys.modules`), which
    cloudpickle (Ray's) therefore pickles by value instead of by reference. One for the process."""
    namespace: dict[str, Any] = {"__name__": HOOK_NAME}
    exec(compile(_HOOK_SOURCE.read_text(encoding="utf-8"), str(_HOOK_SOURCE), "exec"), namespace)
    hook = namespace["setup_worker"]
    hook.__name__ = hook.__qualname__ = HOOK_NAME
    return hook  # type: ignore[no-any-return]


def is_ours(hook: object) -> bool:
    """Whether a runtime_env's hook is ours: by name, or the hook `worker_hook()` made (once uploaded,
    Ray shows it by its name)."""
    if isinstance(hook, str):
        return hook in (RAY_HOOK, HOOK_NAME)
    return getattr(hook, "__code__", None) is worker_hook().__code__


def _existing_hook(runtime_env: dict[str, Any]) -> object:
    """The hook a runtime_env names: its own field, or Ray's variable in its env_vars."""
    hook = runtime_env.get("worker_process_setup_hook")
    env_vars = runtime_env.get("env_vars")
    if hook is None and isinstance(env_vars, dict):
        hook = env_vars.get(HOOK_ENV_VAR)
    return hook


def _submitted_job_env() -> dict[str, Any] | None:
    """The runtime_env of a `ray job submit`, which Ray merges with ray.init's (a clash is an error)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")  # set for the entrypoint of a `ray job submit`
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
    submitted = _submitted_job_env()
    runtime_env = kwargs.get("runtime_env")
    if runtime_env is None:
        # ray.init's runtime_env replaces the JobConfig's: start from the JobConfig's so nothing is lost.
        base = getattr(kwargs.get("job_config"), "runtime_env", None) if submitted is None else None
        runtime_env = dict(base) if isinstance(base, dict) else {}
    elif not isinstance(runtime_env, dict):
        return kwargs
    hook = next((h for h in map(_existing_hook, (runtime_env, submitted or {})) if h is not None), None)
    if hook is not None and not is_ours(hook):
        warn_once(
            "ray-hook-taken",
            "te_offload_shim: the Ray job already has worker_process_setup_hook=%r; not adding %s. "
            "Chain it: call te_offload_shim.ray_setup() first thing in your hook, or set "
            "env_vars VERL_USE_EXTERNAL_MODULES=te_offload_shim (verl) / PYTHONPATH to the sitecustomize "
            "bootstrap (te-offload-shim run).",
            hook,
            RAY_HOOK,
        )
    if hook is not None or (submitted or {}).get("unreadable"):  # ours already, or the job's cannot be read
        return kwargs
    if swapping := env_swapping(runtime_env, submitted):
        warn_once(
            "ray-hook-env",
            "te_offload_shim: the Ray job's runtime_env sets %s (another Python environment); not adding the "
            "setup hook. Where te_offload_shim is installed there, pass worker_process_setup_hook=%r yourself.",
            ", ".join(swapping),
            RAY_HOOK,
        )
        return kwargs
    # a copy of the runtime_env with our hook, which fails open where the worker cannot import us
    return {**kwargs, "runtime_env": {**runtime_env, "worker_process_setup_hook": worker_hook()}}
