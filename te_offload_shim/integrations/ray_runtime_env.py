"""Ray: can the workers of a job import te_offload_shim, and a setup hook that is safe either way.

Ray imports a `worker_process_setup_hook` given by name in every worker before its first task and
kills the worker when that fails (a job that works without the shim would die with it). So:

- `hook_blockers()` says, from the job's runtime_env, why its workers could not import the package
  the way this process does: a runtime_env that installs another Python environment, or `env_vars`
  that move the import path away from where we come from (`PYTHONPATH` without our folder,
  `PYTHONHOME`, `PYTHONNOUSERSITE` / `PYTHONUSERBASE` / `HOME` for a user-site install), or a
  package found only in the driver's script folder or current directory, which Ray puts on a
  worker's path only after the hook ran. It is a pure function of its arguments; `blockers()`
  gathers them from this process. Empty: add the hook.
- `worker_hook()` is the hook we add: a function that Ray ships by value (cloudpickle), so loading
  it needs nothing of ours. Where a worker cannot import the package after all (an actor's own
  runtime_env, a cluster whose raylet has another PYTHONPATH, a node built from another image), it
  says so in one line and the worker goes on without the shim.

Standard library only; imported when the shim wraps a `ray.init` call.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any, NamedTuple

PACKAGE = "te_offload_shim"
# runtime_env fields that give the workers another Python environment, where the package may be missing
ENV_SWAPPING = ("pip", "conda", "uv", "container", "image_uri", "py_executable")
# the name Ray shows for our hook (runtime_env["worker_process_setup_hook"] once uploaded)
HOOK_NAME = "te_offload_shim_ray_setup"


class Origin(NamedTuple):
    """Where this process imports the package from, and the environment that decides it."""

    root: str  # the folder holding te_offload_shim/, absolute and normalised
    kind: str  # "site" (site-packages, or a finder installed there), "user-site", "pythonpath", "script"
    environ: Mapping[str, str]  # this process's environment: what `${VAR}` in env_vars expands to


def hook_blockers(runtime_env: Mapping[str, Any], submitted: Mapping[str, Any] | None, origin: Origin) -> list[str]:
    """Why the job's workers could not import the package (each reason one phrase); empty if they can.

    `runtime_env` is ray.init's, `submitted` the one a `ray job submit` gave (Ray merges the two:
    both count). The workers are assumed to run this interpreter, with the environment of this
    process where the job does not change it (true for a cluster that `ray.init` starts here; for
    another cluster the hook we add fails open)."""
    envs = [env for env in (submitted, runtime_env) if isinstance(env, Mapping)]
    found = [f"runtime_env sets {key} (another Python environment)" for key in ENV_SWAPPING if _given(envs, key)]
    env_vars: dict[str, str] = {}
    for env in envs:  # ray.init's env_vars after the submitted job's: they win
        given = env.get("env_vars")
        if isinstance(given, Mapping):
            env_vars.update({str(k): str(v) for k, v in given.items()})
    ships_path = _given(envs, "working_dir") or _given(envs, "py_modules")
    if _ships_the_package(envs, origin.root):
        return found
    found += _path_changes(env_vars, ships_path, origin)
    return found


def _given(envs: Sequence[Mapping[str, Any]], key: str) -> bool:
    return any(env.get(key) for env in envs)


def _path_changes(env_vars: Mapping[str, str], ships_path: bool, origin: Origin) -> list[str]:
    env = origin.environ
    found = []
    if "PYTHONHOME" in env_vars and _expand(env_vars["PYTHONHOME"], env) != env.get("PYTHONHOME", ""):
        found.append(f"env_vars PYTHONHOME={env_vars['PYTHONHOME']!r} (another Python installation)")
    where = f"where te_offload_shim is imported from here ({origin.root})"
    if origin.kind in ("pythonpath", "script"):
        if "PYTHONPATH" in env_vars:
            entries = _expand(env_vars["PYTHONPATH"], env).split(os.pathsep)
            if ships_path:  # with working_dir / py_modules, Ray appends the cluster's own PYTHONPATH
                entries += env.get("PYTHONPATH", "").split(os.pathsep)
        else:
            entries = env.get("PYTHONPATH", "").split(os.pathsep)  # the workers inherit it
        if origin.root not in {_normal(p) for p in entries if p}:
            if "PYTHONPATH" in env_vars:
                found.append(f"env_vars PYTHONPATH={env_vars['PYTHONPATH']!r}, without the folder {where}")
            elif not ships_path:  # a working_dir may be that folder (a submitted job runs inside it)
                found.append(
                    f"a package found only in the script's folder or the current directory ({origin.root}), "
                    "which Ray puts on a worker's path after its setup hook"
                )
    if origin.kind == "user-site":
        if value := env_vars.get("PYTHONNOUSERSITE"):
            found.append(f"env_vars PYTHONNOUSERSITE={value!r}, which drops the user site {where}")
        moved = [name for name in ("PYTHONUSERBASE", "HOME") if name in env_vars]
        if "PYTHONUSERBASE" in env or "PYTHONUSERBASE" in env_vars:
            moved = [name for name in moved if name != "HOME"]  # HOME places the user site only without it
        for name in moved:
            if _expand(env_vars[name], env) != env.get(name, ""):
                found.append(f"env_vars {name}={env_vars[name]!r}, which moves the user site {where}")
    return found


def _ships_the_package(envs: Sequence[Mapping[str, Any]], root: str) -> bool:
    """Whether the runtime_env itself gives the workers the package: py_modules holding it (a path
    or the module object) or our folder as the working_dir."""
    for env in envs:
        for module in env.get("py_modules") or ():
            name = getattr(module, "__name__", None)
            if name == PACKAGE or (isinstance(module, str) and _normal(module) == os.path.join(root, PACKAGE)):
                return True
        working_dir = env.get("working_dir")
        if isinstance(working_dir, str) and _normal(working_dir) == root:
            return True
    return False


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)


def _expand(value: str, environ: Mapping[str, str]) -> str:
    """`value` as a Ray worker's environment gets it: `$VAR` and `${VAR}` replaced from the
    raylet's environment (os.path.expandvars), then any `${VAR}` left over dropped
    (ray._private.utils.update_envs, Ray 2.60)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        return environ[name] if name in environ else match.group(0)

    return re.sub(r"\$\{[A-Z0-9_]+\}", "", _VARIABLE.sub(replace, value))


def _normal(path: str) -> str:
    return os.path.normcase(os.path.normpath(os.path.abspath(path)))


# --- facts of this process -----------------------------------------------------------------------


def origin() -> Origin:
    """Where this process imports the package from."""
    import site
    import sysconfig

    here = sys.modules[PACKAGE].__file__ or ""
    root = _normal(os.path.dirname(os.path.dirname(os.path.abspath(here))))
    environ = dict(os.environ)
    paths = sysconfig.get_paths()
    sites = {_normal(p) for p in [*getattr(site, "getsitepackages", list)(), paths["purelib"], paths["platlib"]]}
    pythonpath = {_normal(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    user_site = getattr(site, "getusersitepackages", lambda: None)() if site.ENABLE_USER_SITE else None
    if root in sites or _installed(sites):
        kind = "site"
    elif root in pythonpath:
        kind = "pythonpath"
    elif user_site and root == _normal(user_site):
        kind = "user-site"
    elif root in _start_up_folders():
        kind = "script"
    else:  # a finder installed from site-packages (an editable install), a path .pth, or added at run time
        kind = "site"
    return Origin(root, kind, environ)


def _installed(sites: set[str]) -> bool:
    """Whether this interpreter also finds the package without PYTHONPATH or the script's folder: in
    its site-packages, or through a finder an install put on sys.meta_path (an editable install's)."""
    import importlib.machinery

    try:
        if importlib.machinery.PathFinder.find_spec(PACKAGE, sorted(sites)) is not None:
            return True
    except Exception:  # an odd path entry: ask the finders below
        pass
    for finder in list(sys.meta_path):
        if finder is importlib.machinery.PathFinder or getattr(finder, "__module__", "").startswith(PACKAGE):
            continue  # the path (searched above, and where we came from), and our own import watcher
        try:
            if getattr(finder, "find_spec", None) and finder.find_spec(PACKAGE, None) is not None:
                return True
        except Exception:  # another project's finder: whatever it does, it does not decide this
            pass
    return False


def _start_up_folders() -> set[str]:
    """The folder Python put first on sys.path at start-up (the script's, or the current directory
    for -c, -m and the REPL), unless -P / PYTHONSAFEPATH kept it off."""
    if getattr(sys.flags, "safe_path", False):
        return set()
    folders = {_normal(os.getcwd())}
    script = sys.argv[0] if sys.argv else ""
    if script and script not in ("-c", "-m") and os.path.isfile(script):
        folders.add(_normal(os.path.dirname(os.path.realpath(script))))
    return folders


def blockers(runtime_env: Mapping[str, Any], submitted: Mapping[str, Any] | None) -> list[str]:
    """`hook_blockers` for this process."""
    return hook_blockers(runtime_env, submitted, origin())


# --- the hook ----------------------------------------------------------------------------------


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
    code = getattr(hook, "__code__", None)
    return code is _hook_code()
