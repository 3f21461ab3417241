"""The shim in Ray workers, on a real local cluster: by the setup hook the user passes, by our
automatic addition of that hook to `ray.init`, and by verl's `VERL_USE_EXTERNAL_MODULES`.

One cluster for the whole test session (tests/support/ray_session.py: its interpreter cannot import the
package by itself), on the loopback address. Each route is a fresh driver process, as a real job is;
its actor imports a real verl 0.8.0 caller and reports whether the caller's alias is wrapped. The
cluster is started without the repo or verl on its PYTHONPATH: as on a real cluster, workers get
the driver's environment only through `runtime_env["env_vars"]`. Jobs whose workers cannot import
the package are tests/hostile/test_ray_workers.py.
"""

from __future__ import annotations

import os
from typing import ClassVar

import pytest
from conftest import REPO, verl_path
from support.ray_session import Cluster, drive

TESTS = REPO / "tests"

CALLER = "verl.workers.engine.megatron.transformer_impl"


def _drive(cluster: Cluster, *, shim: bool, runtime_env: dict) -> tuple[dict, str]:
    env_vars = {"PYTHONPATH": os.pathsep.join([str(REPO), str(verl_path("0.8.0"))])}
    runtime_env = {**runtime_env, "env_vars": {**env_vars, **runtime_env.get("env_vars", {})}}
    return drive(cluster, {"shim": shim, "caller": CALLER, "runtime_env": runtime_env})


def _check_status(s: dict) -> None:
    verl = {r["name"]: r for r in s["targets"]}["verl"]
    assert verl["present"] is True and verl["version"] == "0.8.0" and verl["would_be_patched"] is True
    assert s["healthy"] is True


def test_user_passed_setup_hook(ray_cluster: Cluster) -> None:
    r, _ = _drive(ray_cluster, shim=False, runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"})
    assert r["before"] is True and r["hook_env"] == "te_offload_shim.ray_setup"
    assert r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])
    assert r["status"]["routes"]["ray_worker_setup_hook"] is True


def test_ray_init_gains_the_hook_when_the_shim_is_active_in_the_driver(ray_cluster: Cluster) -> None:
    r, _ = _drive(ray_cluster, shim=True, runtime_env={})
    # our hook goes by value (Ray's key for a function it holds), so that it loads in any worker
    assert r["hook_env"].startswith("ray_runtime_env_func::"), "ray.init must have added our hook to the job"
    assert r["before"] is True and r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])
    assert r["status"]["routes"]["ray_worker_setup_hook"] is True


def test_a_users_own_hook_is_kept(ray_cluster: Cluster) -> None:
    # The user's hook does not chain ours: we must neither replace it nor add ours, and say so.
    hooks = TESTS / "hostile" / "targets"  # user_hook.py
    env = {"worker_process_setup_hook": "user_hook.setup"}
    r, err = _drive(
        ray_cluster,
        shim=True,
        runtime_env={**env, "env_vars": {"PYTHONPATH": os.pathsep.join([str(hooks), str(verl_path("0.8.0"))])}},
    )
    assert r["hook_env"] == "user_hook.setup"
    assert r["before"] is False and r["loaded"] is False and r["layers"] == 0, "no other route: unpatched"
    assert "already has worker_process_setup_hook='user_hook.setup'" in err
    assert "call te_offload_shim.ray_setup() first thing in your hook" in err


def test_verl_external_modules_through_env_vars(ray_cluster: Cluster) -> None:
    r, _ = _drive(ray_cluster, shim=False, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": "te_offload_shim"}})
    assert r["hook_env"] is None and r["before"] is False, "no hook: verl's import brought the shim in"
    assert r["layers"] == 1 and r["state"] == "patched"
    _check_status(r["status"])
    assert r["status"]["routes"]["verl_external_modules"] is True


class JobConfig:
    runtime_env: ClassVar[dict] = {"env_vars": {"A": "1"}}


@pytest.mark.subprocess()
def test_setup_hook_rules_without_a_cluster() -> None:
    from te_offload_shim.integrations import ray_runtime_env as a  # where the runtime_env rule lives
    from te_offload_shim.integrations.ray_runtime_env import is_ours as our_hook

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
    hook = "OURS"

    def shown(value: object) -> object:  # our hook (a function made for each ray.init) as "OURS"
        if isinstance(value, dict):
            return {k: shown(v) for k, v in value.items()}
        return hook if callable(value) and our_hook(value) else value

    out = {name: shown(value) for name, value in out.items()}
    assert out["none"] == {"runtime_env": {"worker_process_setup_hook": hook}}
    assert out["user"] == {"runtime_env": {"env_vars": {"B": "2"}, "worker_process_setup_hook": hook}}
    assert out["user_untouched"] == {"env_vars": {"B": "2"}}, "the caller's dict is not changed"
    assert out["job_config"] == {"env_vars": {"A": "1"}, "worker_process_setup_hook": hook}
    assert out["taken"] == {"runtime_env": {"worker_process_setup_hook": "x.y"}}
    assert out["ours"] == {"runtime_env": {"worker_process_setup_hook": h}}, "the user's own naming of ours is kept"
    assert out["pip"] == {"runtime_env": {"pip": ["x"]}}
    assert out["submitted_taken"] == {}
    # A submitted job's runtime_env is merged by Ray; ours must only add the hook key.
    assert out["submitted"] == {"worker_process_setup_hook": hook}
    assert wrapped is True and restored is True
