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

Standard library only; imported when the shim wraps a `ray.init` call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

# runtime_env fields that give the workers another Python environment
ENV_SWAPPING = ("pip", "conda", "uv", "container", "image_uri", "py_executable")
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
def _hook_code() -> CodeType:
    namespace: dict[str, Any] = {"__name__": HOOK_NAME}
    exec(compile(_HOOK_SOURCE.read_text(encoding="utf-8"), str(_HOOK_SOURCE), "exec"), namespace)
    return namespace["setup_worker"].__code__


def worker_hook() -> Callable[[], None]:
    """The setup hook for `ray.init`'s runtime_env: activation/ray_worker.py's `setup_worker` in a
    module namespace of its own, which cloudpickle (Ray's) therefore pickles by value instead of by
    reference."""
    import builtins
    import types

    namespace = {"__builtins__": builtins, "__name__": HOOK_NAME}
    hook = types.FunctionType(_hook_code(), namespace, HOOK_NAME)
    hook.__qualname__ = HOOK_NAME
    return hook


def is_ours(hook: object) -> bool:
    """Whether a runtime_env's hook is ours: by name, or the hook `worker_hook()` made (once uploaded,
    Ray shows it by its name)."""
    if isinstance(hook, str):
        return hook in ("te_offload_shim.ray_setup", HOOK_NAME)
    return getattr(hook, "__code__", None) is _hook_code()
