"""The `.pth` route, and which activation routes are in force.

`te-offload-shim enable` writes `te_offload_shim.pth` into a site-packages directory (one line that
site.py runs at every interpreter start); `disable` removes it. `routes()` tells which routes are in
force for this interpreter and the processes it starts, for `te-offload-shim status`. Standard
library only; imported by the CLI, never at start-up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import site
import stat
import sysconfig
import tempfile
from typing import Any

PTH_NAME = "te_offload_shim.pth"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
STARTUP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pythonstartup.py")
VERL_EXTERNAL = "VERL_USE_EXTERNAL_MODULES"

# site.py runs every line that starts with "import" (and only those). The line must:
# - honour TE_OFFLOAD_SHIM=0 without importing the package (same spellings as _switches._FALSE);
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


# --- the .pth file ------------------------------------------------------------------------------


def default_site() -> str:
    """This interpreter's site-packages (the venv's inside a venv)."""
    return sysconfig.get_paths()["purelib"]


class SiteError(Exception):
    """A site directory we cannot use; the message is one line for the operator."""


def _site_directory(site_dir: str | None) -> str:
    """The directory to write into or remove from. A `site_dir` must exist: a typo would otherwise
    create a folder no interpreter reads (enable) or report nothing to remove (disable) while the
    real file stays. Raises SiteError with a one-line reason."""
    directory = os.path.abspath(site_dir or default_site())
    if site_dir is not None and not os.path.exists(directory):
        raise SiteError(f"{directory} does not exist (no interpreter reads .pth files there)")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise SiteError(f"{directory} is not a directory")
    return directory


def enable(site_dir: str | None = None) -> tuple[str, str]:
    """Write the .pth file; returns (what happened, path). Idempotent; safe to run from many
    processes at once (containers sharing one venv volume, nodes sharing an NFS environment, where
    the processes may even have the same PID). Raises SiteError with a one-line reason."""
    directory = _site_directory(site_dir)
    path = os.path.join(directory, PTH_NAME)
    try:
        with open(path, "rb") as f:
            current: bytes | None = f.read()  # bytes: a file that is not UTF-8 is replaced, not a traceback
        # as we would write it: a regular file (not a link planted in its name) that every user can read
        mode = os.lstat(path).st_mode
        in_place = stat.S_ISREG(mode) and mode & 0o444 == 0o444
    except FileNotFoundError:
        current, in_place = None, False
    except OSError as exc:
        raise SiteError(f"cannot read {path}: {exc.strerror or exc}") from None
    if current == PTH_TEXT.encode() and in_place:
        return "already enabled", path
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)  # the interpreter's own site-packages may not exist yet
        # A name no other writer can have (mkstemp: O_EXCL, never following a link planted under
        # a predictable name), which site.py never reads (it does not end in .pth).
        fd, tmp = tempfile.mkstemp(prefix=f".{PTH_NAME}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # Every user of the interpreter must be able to read the file: site.py skips a .pth it
            # cannot open without a word, so a 0600 file written under `umask 077` (a hardened root
            # shell, a Slurm prolog) would leave every other user's processes without the shim. Set
            # with fchmod, which the umask does not touch.
            os.fchmod(f.fileno(), 0o644)
            f.write(PTH_TEXT)
            f.flush()
            try:  # on the disk (on the server, for NFS) before the rename puts the file in force
                os.fsync(f.fileno())
            except OSError as exc:  # a file system that cannot sync (some FUSE mounts) has written them all the same
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
        os.replace(tmp, path)  # never a half-written line that site.py would run
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise SiteError(f"cannot write {path}: {exc.strerror or exc}") from None
    return ("enabled" if current is None else "updated"), path


def disable(site_dir: str | None = None) -> tuple[str, str]:
    """Remove the .pth file; returns (what happened, path). Idempotent. Raises SiteError with a
    one-line reason (a read-only site, a `site_dir` that is not a directory)."""
    path = os.path.join(_site_directory(site_dir), PTH_NAME)
    try:
        os.remove(path)
    except OSError as exc:
        if not os.path.lexists(path):  # gone, or never there (on a read-only mount that is EROFS, not ENOENT)
            return "already disabled", path
        raise SiteError(f"cannot remove {path}: {exc.strerror or exc}") from None
    return "disabled", path


def pth_files() -> list[dict[str, Any]]:
    """Every te_offload_shim.pth this interpreter runs: whether its line is the current one, and
    whether this user can read it (site.py skips a file it cannot open, silently) and who else can.
    `current` is None when the file cannot be read."""
    # the directories whose .pth files this interpreter runs at start-up (site.getsitepackages is in
    # every Python 3.10+ site.py: virtualenv < 20, whose own lacked it, predates 3.10)
    dirs = site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    found = []
    for directory in dict.fromkeys(os.path.abspath(d) for d in [*dirs, default_site()]):
        path = os.path.join(directory, PTH_NAME)
        if not os.path.isfile(path):
            continue
        entry: dict[str, Any] = {"path": path, "current": None, "readable": False, "mode": None}
        with contextlib.suppress(OSError):
            entry["mode"] = f"{stat.S_IMODE(os.stat(path).st_mode):04o}"
            with open(path, "rb") as f:  # bytes: a file that is not UTF-8 is simply not ours
                entry.update(readable=True, current=f.read() == PTH_TEXT.encode())
        found.append(entry)
    return found


# --- routes in force ----------------------------------------------------------------------------


def routes() -> dict[str, Any]:
    """The activation routes in force for this interpreter and the processes it starts."""
    from te_offload_shim.activation import ray_worker  # its flag only: importing it runs nothing
    from te_offload_shim.integrations import ray_runtime_env as ray

    env = os.environ
    python_path = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        "pth": pth_files(),
        "sitecustomize_bootstrap": BOOTSTRAP_DIR in python_path,
        "verl_external_modules": "te_offload_shim" in [m.strip() for m in env.get(VERL_EXTERNAL, "").split(",")],
        # an empty PYTHONSTARTUP is the current folder, never our file
        "pythonstartup": os.path.abspath(env.get("PYTHONSTARTUP", "")) == STARTUP_FILE,
        # ran here (a Ray worker), or named for the workers
        "ray_worker_setup_hook": ray_worker.hook_ran or env.get(ray.HOOK_ENV_VAR) == ray.RAY_HOOK,
        "ray_init_propagation": "when ray.init is called in a process where the shim is installed",
    }
