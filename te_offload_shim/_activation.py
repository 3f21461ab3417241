"""How the shim gets into a process: the `.pth` line, the sitecustomize bootstrap, Ray's setup hook.

Three jobs, all standard library: write/remove `te_offload_shim.pth`; add our
`worker_process_setup_hook` to the runtime_env of `ray.init` (so every worker of the job, on every
node, is covered); and tell which activation routes are in force, for `te-offload-shim status`.
Imported lazily (by the CLI, or when `ray` is imported in a process where the shim is installed).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

PTH_NAME = "te_offload_shim.pth"
RAY_HOOK = "te_offload_shim.ray_setup"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
STARTUP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py")
VERL_EXTERNAL = "VERL_USE_EXTERNAL_MODULES"

# site.py runs every line that starts with "import" (and only those). The line must:
# - honour TE_OFFLOAD_SHIM=0 without importing the package (same spellings as _config._FALSE);
# - stay silent when the package is gone but the file stayed (pip does not know about it), since
#   an error prints "Error processing line" at every start (coverage #223);
# - be harmless when run twice (venv, cpython #75723): the second import is a sys.modules hit.
PTH_LINE = (
    "import os; exec('try:\\n import te_offload_shim\\nexcept Exception:\\n pass') "
    "if os.environ.get('TE_OFFLOAD_SHIM', '').strip().lower() not in ('0', 'false', 'no', 'off') else None"
)
PTH_TEXT = (
    "# Activates te_offload_shim at every interpreter start. Written by `te-offload-shim enable`;\n"
    "# remove with `te-offload-shim disable`. TE_OFFLOAD_SHIM=0 turns it off for one process.\n"
    f"{PTH_LINE}\n"
)

# runtime_env fields that give the workers another Python environment, where the package may be
# missing: a setup hook that cannot be imported fails every worker of the job, so we stay out.
_ENV_SWAPPING = ("pip", "conda", "uv", "container", "image_uri", "py_executable")
_HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set for the entrypoint of a `ray job submit`


def _log(key: str, message: str, *args: object) -> None:
    from ._log import warn_once

    warn_once(key, message, *args)


# --- the .pth file ------------------------------------------------------------------------------


def default_site() -> str:
    """This interpreter's site-packages (the venv's inside a venv)."""
    return sysconfig.get_paths()["purelib"]


class SiteError(Exception):
    """A site directory we cannot use; the message is one line for the operator."""


def enable(site_dir: str | None = None) -> tuple[str, str]:
    """Write the .pth file; returns (what happened, path). Idempotent.

    A `site_dir` must exist: a typo would otherwise create a folder no interpreter reads and
    report the shim enabled. Raises SiteError with a one-line reason."""
    directory = os.path.abspath(site_dir or default_site())
    if site_dir is not None and not os.path.exists(directory):
        raise SiteError(f"{directory} does not exist (no interpreter reads .pth files there)")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise SiteError(f"{directory} is not a directory")
    path = os.path.join(directory, PTH_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    except OSError as exc:
        raise SiteError(f"cannot read {path}: {exc.strerror or exc}") from None
    if current == PTH_TEXT:
        return "already enabled", path
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)  # the interpreter's own site-packages may not exist yet
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(PTH_TEXT)
        os.replace(tmp, path)  # never a half-written line that site.py would run
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise SiteError(f"cannot write {path}: {exc.strerror or exc}") from None
    return ("enabled" if current is None else "updated"), path


def disable(site_dir: str | None = None) -> tuple[str, str]:
    """Remove the .pth file; returns (what happened, path). Idempotent."""
    path = os.path.join(os.path.abspath(site_dir or default_site()), PTH_NAME)
    try:
        os.remove(path)
    except FileNotFoundError:
        return "already disabled", path
    return "disabled", path


def site_dirs() -> list[str]:
    """The directories whose .pth files this interpreter runs at start-up."""
    dirs = list(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs.append(default_site())
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs))


def pth_files() -> list[dict[str, Any]]:
    """Every te_offload_shim.pth this interpreter runs, and whether its line is the current one."""
    found = []
    for directory in site_dirs():
        path = os.path.join(directory, PTH_NAME)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read() == PTH_TEXT
            except OSError:
                current = False
            found.append({"path": path, "current": current})
    return found


# --- routes in force ----------------------------------------------------------------------------


def _path_entries(value: str | None) -> list[str]:
    return [os.path.abspath(p) for p in (value or "").split(os.pathsep) if p]


def routes(environ: Any = None) -> dict[str, Any]:
    """The activation routes in force for this interpreter and the processes it starts."""
    env = os.environ if environ is None else environ
    external = [m.strip() for m in env.get(VERL_EXTERNAL, "").split(",") if m.strip()]
    startup = env.get("PYTHONSTARTUP", "")
    return {
        "pth": pth_files(),
        "sitecustomize_bootstrap": os.path.abspath(BOOTSTRAP_DIR) in _path_entries(env.get("PYTHONPATH")),
        "verl_external_modules": "te_offload_shim" in external,
        "pythonstartup": bool(startup) and os.path.abspath(startup) == os.path.abspath(STARTUP_FILE),
        "ray_worker_setup_hook": env.get(_HOOK_ENV_VAR) == RAY_HOOK,  # set by Ray in a job's workers
        "ray_init_propagation": "when ray.init is called in a process where the shim is installed",
    }


# --- Ray: add our setup hook to the job's runtime_env -------------------------------------------


def _existing_hook(runtime_env: Any) -> object:
    if not isinstance(runtime_env, dict):
        return None
    hook = runtime_env.get("worker_process_setup_hook")
    if hook is None:
        env_vars = runtime_env.get("env_vars") or {}
        hook = env_vars.get(_HOOK_ENV_VAR) if isinstance(env_vars, dict) else None
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
        if hook != RAY_HOOK:
            _log(
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
    swapping = [key for key in _ENV_SWAPPING if runtime_env.get(key) or (submitted or {}).get(key)]
    if swapping:
        _log(
            "ray-hook-env",
            "te_offload_shim: the Ray job's runtime_env sets %s, so its workers may lack te_offload_shim; "
            "not adding the setup hook. Install te-offload-shim there and pass "
            "worker_process_setup_hook=%r yourself.",
            ",".join(swapping),
            RAY_HOOK,
        )
        return kwargs
    new_env = dict(runtime_env)
    new_env["worker_process_setup_hook"] = RAY_HOOK
    return {**kwargs, "runtime_env": new_env}


RAY_INIT_KIND = "ray.init"


def _init_handler(record: Any) -> Callable[..., Any]:
    def handler(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        shim = sys.modules.get("te_offload_shim")
        if record.armed and shim is not None and shim.installed():
            try:
                kwargs = with_setup_hook(kwargs)
            except Exception as exc:  # ray.init must go on whatever happens here
                _log("ray-hook-error", "te_offload_shim: could not add the Ray setup hook: %r", exc)
        return wrapped(*args, **kwargs)

    return handler


def on_ray_import(ray: ModuleType) -> None:
    """Post-import callback for `ray`: wrap `ray.init` once (a registry record undoes it)."""
    from . import _registry
    from ._wrapper import ShimWrapper, is_ours

    with _registry.lock:
        current = vars(ray).get("init")
        if current is None or is_ours(current):
            return
        record = _registry.Record(RAY_INIT_KIND, ray, "init", current)
        wrapper = ShimWrapper(current, _init_handler(record), record, (ray.__name__, "init"))
        _registry.add(record, wrapper, lambda: setattr(ray, "init", wrapper))
