"""The shim in Ray workers, on a real local cluster: by the setup hook the user passes, by our
automatic addition of that hook to `ray.init`, and by verl's `VERL_USE_EXTERNAL_MODULES`.

One cluster for the whole test session (shared by the xdist workers through a lock file), on the
loopback address. Each route is a fresh driver process, as a real job is; its actor imports a real
verl 0.8.0 caller and reports whether the caller's alias is wrapped. The cluster is started
without the repo or verl on its PYTHONPATH: as on a real cluster, workers get the driver's
environment only through `runtime_env["env_vars"]`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import REPO, SUPPORT, TESTS, verl_path

CALLER = "verl.workers.engine.megatron.transformer_impl"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_", "RAY_"))}
    # Without this a local head turns on token auth with a token in ~/.ray, which other Ray
    # sessions on the same machine may overwrite: loopback only, so no token.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def _start_cluster(state: Path) -> dict:
    log = open(state.with_suffix(".log"), "w")
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "ray_head.py")],
        env=_clean_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    address = proc.stdout.readline().strip() if proc.stdout else ""
    if not address:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"the Ray head did not start: {state.with_suffix('.log').read_text()[-3000:]}")
    _heads[proc.pid] = proc
    return {"address": address, "pgid": proc.pid, "users": 0}


_heads: dict[int, subprocess.Popen[str]] = {}


def _stop_cluster(pgid: int) -> None:
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


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[str]:
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    state = shared / "ray-cluster.json"
    with open(shared / "ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = json.loads(state.read_text()) if state.exists() else _start_cluster(state)
        info["users"] += 1
        state.write_text(json.dumps(info))
    yield info["address"]
    with open(shared / "ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = json.loads(state.read_text())
        info["users"] -= 1
        if info["users"] == 0:
            _stop_cluster(info["pgid"])
            state.unlink()
        else:
            state.write_text(json.dumps(info))


def _drive(address: str, *, shim: bool, runtime_env: dict) -> tuple[dict, str]:
    env_vars = {"PYTHONPATH": os.pathsep.join([str(REPO), str(verl_path("0.8.0"))])}
    runtime_env = {**runtime_env, "env_vars": {**env_vars, **runtime_env.get("env_vars", {})}}
    args = json.dumps({"shim": shim, "caller": CALLER, "address": address, "runtime_env": runtime_env})
    env = {**_clean_env(), "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(SUPPORT / "ray_driver.py"), args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    lines = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(lines[-1]), proc.stderr


def _check_status(s: dict) -> None:
    verl = {r["name"]: r for r in s["targets"]}["verl"]
    assert verl["present"] is True and verl["version"] == "0.8.0" and verl["would_be_patched"] is True
    assert s["healthy"] is True


def test_user_passed_setup_hook(ray_address: str) -> None:
    r, _ = _drive(ray_address, shim=False, runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"})
    assert r["before"] is True and r["hook_env"] == "te_offload_shim.ray_setup"
    assert r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])
    assert r["status"]["routes"]["ray_worker_setup_hook"] is True


def test_ray_init_gains_the_hook_when_the_shim_is_active_in_the_driver(ray_address: str) -> None:
    r, _ = _drive(ray_address, shim=True, runtime_env={})
    assert r["hook_env"] == "te_offload_shim.ray_setup", "ray.init must have added our hook to the job"
    assert r["before"] is True and r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])


def test_a_users_own_hook_is_kept(ray_address: str) -> None:
    # The user's hook does not chain ours: we must neither replace it nor add ours, and say so.
    hooks = TESTS / "hostile" / "targets"  # user_hook.py
    env = {"worker_process_setup_hook": "user_hook.setup"}
    r, err = _drive(
        ray_address,
        shim=True,
        runtime_env={**env, "env_vars": {"PYTHONPATH": os.pathsep.join([str(hooks), str(verl_path("0.8.0"))])}},
    )
    assert r["hook_env"] == "user_hook.setup"
    assert r["before"] is False and r["loaded"] is False and r["layers"] == 0, "no other route: unpatched"
    assert "already has worker_process_setup_hook='user_hook.setup'" in err
    assert "call te_offload_shim.ray_setup() first thing in your hook" in err


def test_verl_external_modules_through_env_vars(ray_address: str) -> None:
    r, _ = _drive(ray_address, shim=False, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": "te_offload_shim"}})
    assert r["hook_env"] is None and r["before"] is False, "no hook: verl's import brought the shim in"
    assert r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])
    assert r["status"]["routes"]["verl_external_modules"] is True


class JobConfig:
    runtime_env: ClassVar[dict] = {"env_vars": {"A": "1"}}


@pytest.mark.subprocess()
def test_setup_hook_rules_without_a_cluster() -> None:
    from te_offload_shim.integrations import ray as a  # where the runtime_env rule lives

    h = "te_offload_shim.ray_setup"
    user = {"env_vars": {"B": "2"}}
    out = {
        "none": a.with_setup_hook({}),
        "user": a.with_setup_hook({"runtime_env": user}),
        "user_untouched": user,
        "job_config": a.with_setup_hook({"job_config": JobConfig()})["runtime_env"],
        "taken": a.with_setup_hook({"runtime_env": {"worker_process_setup_hook": "x.y"}}),
        "ours": a.with_setup_hook({"runtime_env": {"worker_process_setup_hook": h}}),
        "pip": a.with_setup_hook({"runtime_env": {"pip": ["x"]}}),
    }
    os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = '{"runtime_env": {"worker_process_setup_hook": "job.hook"}}'
    out["submitted_taken"] = a.with_setup_hook({})
    os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = '{"runtime_env": {"env_vars": {"C": "3"}}}'
    out["submitted"] = a.with_setup_hook({"job_config": JobConfig()})["runtime_env"]
    import ray

    import te_offload_shim
    from te_offload_shim.engine.wrapper import is_ours

    wrapped = is_ours(vars(ray)["init"])
    te_offload_shim.uninstall()
    restored = not is_ours(vars(ray)["init"])
    hook = h
    assert out["none"] == {"runtime_env": {"worker_process_setup_hook": hook}}
    assert out["user"] == {"runtime_env": {"env_vars": {"B": "2"}, "worker_process_setup_hook": hook}}
    assert out["user_untouched"] == {"env_vars": {"B": "2"}}, "the caller's dict is not changed"
    assert out["job_config"] == {"env_vars": {"A": "1"}, "worker_process_setup_hook": hook}
    assert out["taken"] == {"runtime_env": {"worker_process_setup_hook": "x.y"}}
    assert out["ours"] == {"runtime_env": {"worker_process_setup_hook": hook}}
    assert out["pip"] == {"runtime_env": {"pip": ["x"]}}
    assert out["submitted_taken"] == {}
    # A submitted job's runtime_env is merged by Ray; ours must only add the hook key.
    assert out["submitted"] == {"worker_process_setup_hook": hook}
    assert wrapped is True and restored is True
