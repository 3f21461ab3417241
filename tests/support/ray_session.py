"""One local Ray cluster for the whole test session (tests/conftest.py's `ray_cluster` fixture), shared
by the xdist workers through a lock file, on the loopback address; and `drive()`, which runs a job's
driver (tests/support/ray_driver.py) against it as a fresh process, as a real job is one.

The cluster, and every driver, runs an interpreter that cannot import te_offload_shim by itself: a
venv with no package of its own, whose one `.pth` line puts this environment's site-packages on its
path as a plain folder. torch, ray, megatron and the rest import from there; this checkout's
editable install does not (it is a `.pth` that site.py would have to run in that folder). So, as on
a real cluster whose nodes lack the package, a worker gets it only as the job gives it (`env_vars`
PYTHONPATH, or the driver's environment when `ray.init` starts the cluster), or not at all. The
cluster is started without the repo or verl on its PYTHONPATH: workers of an existing cluster get
the driver's environment only through `runtime_env["env_vars"]`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]


class Cluster(NamedTuple):
    address: str  # the GCS address
    python: Path  # the interpreter of the cluster and of every driver


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_", "RAY_"))}
    # Without this a local head turns on token auth with a token in ~/.ray, which other Ray
    # sessions on the same machine may overwrite: loopback only, so no token.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def bare_python(root: Path) -> Path:
    """A venv at `root` that sees this environment's site-packages but not this package."""
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
        (site,) = root.glob("lib/python3.*/site-packages")
        paths = sysconfig.get_paths()
        (site / "this_environment.pth").write_text(
            "".join(f"{p}\n" for p in dict.fromkeys([paths["purelib"], paths["platlib"]]))
        )
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('te_offload_shim') is not None)"
    if subprocess.run([str(python), "-c", check], env=clean_env(), cwd=root, timeout=60).returncode != 0:
        raise RuntimeError(f"{python} imports te_offload_shim by itself: the Ray tests could not tell who gave it")
    return python


_heads: dict[int, subprocess.Popen[str]] = {}


def _start(state: Path, python: Path) -> dict[str, Any]:
    log = open(state.with_suffix(".log"), "w")
    proc = subprocess.Popen(
        [str(python), str(SUPPORT / "ray_head.py")],
        env=clean_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
        cwd=state.parent,
    )
    address = proc.stdout.readline().strip() if proc.stdout else ""
    if not address:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"the Ray head did not start: {state.with_suffix('.log').read_text()[-3000:]}")
    _heads[proc.pid] = proc
    return {"address": address, "python": str(python), "pgid": proc.pid, "users": 0}


def _stop(pgid: int) -> None:
    proc = _heads.pop(pgid, None)
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()  # ray.shutdown() in the head
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)  # whatever of ours is left: the group we started
    except ProcessLookupError:
        pass


def shared_cluster(shared: Path) -> Iterator[Cluster]:
    """The session's cluster (started by the first user, stopped by the last), `shared` being a
    folder all the xdist workers of the session see."""
    state = shared / "ray-cluster.json"
    with open(shared / "ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = json.loads(state.read_text()) if state.exists() else _start(state, bare_python(shared / "ray-venv"))
        info["users"] += 1
        state.write_text(json.dumps(info))
    yield Cluster(info["address"], Path(info["python"]))
    with open(shared / "ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = json.loads(state.read_text())
        info["users"] -= 1
        if info["users"] == 0:
            _stop(info["pgid"])
            state.unlink()
        else:
            state.write_text(json.dumps(info))


def drive(
    cluster: Cluster,
    args: dict[str, Any],
    *,
    pythonpath: str | None = str(REPO),
    cwd: Path = REPO,
    module: bool = False,
) -> tuple[dict[str, Any], str]:
    """Run tests/support/ray_driver.py with `args` (its docstring says which) against `cluster`, by path, or
    with `module` as `python -m tests.support.ray_driver`. The driver imports the package from `pythonpath`
    (None: from nothing but `cwd`, as `python -m` in a checkout does). Returns the driver's RESULT and
    its stderr."""
    env = clean_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    target = ["-m", "tests.support.ray_driver"] if module else [str(SUPPORT / "ray_driver.py")]
    command = [str(cluster.python), *target, json.dumps({"address": cluster.address, **args})]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=cwd)
    lines = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(lines[-1]), proc.stderr
