"""Ray jobs whose workers cannot import te_offload_shim, on the session's real local cluster (tests/support/
ray_session.py: the cluster's interpreter does not have the package; the driver imports it from
PYTHONPATH, as with a checkout or a `pip install --target` folder). Each ran without the shim and
died with it, because Ray kills a worker whose setup hook cannot be imported:

- the job's `env_vars` set PYTHONPATH to something else (`{"PYTHONPATH": "/project"}`);
- the cluster was started without the driver's PYTHONPATH, and the job does not pass it on;
- one actor's own runtime_env moves its import path (NeMo-RL gives each worker class its own
  runtime_env), which the driver's `ray.init` cannot see;
- the package sits in the driver's current directory (`python -m ...` in a checkout), which Ray
  adds to a worker's path only after the setup hook.

Each is caught by the hook itself: it is shipped by value and fails open, so such a
worker runs its tasks without the shim and says so in one line.
"""

from __future__ import annotations

from pathlib import Path

from conftest import REPO
from support.ray_session import Cluster, drive


def test_env_vars_that_move_pythonpath_run_the_job_without_the_shim(ray_cluster: Cluster, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    args = {"shim": True, "runtime_env": {"env_vars": {"PYTHONPATH": str(project)}}, "actors": [None]}
    r, _ = drive(ray_cluster, args)
    (report,) = r["reports"]
    assert report.get("answer") == 42, f"the job must run as it does without the shim: {report}"
    assert report["hook_env"].startswith("ray_runtime_env_func::"), "the hook was added, and failed open"
    assert report["loaded"] is False


def test_a_cluster_without_the_drivers_pythonpath_runs_the_job_without_the_shim(ray_cluster: Cluster) -> None:
    r, _ = drive(ray_cluster, {"shim": True, "runtime_env": {}, "actors": [None]})
    (report,) = r["reports"]
    assert report.get("answer") == 42, f"the job must run as it does without the shim: {report}"
    assert report["hook_env"].startswith("ray_runtime_env_func::"), "the hook was added (the driver cannot know)"
    assert report["loaded"] is False


def test_an_actor_whose_own_runtime_env_moves_pythonpath_runs_without_the_shim(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    job = {"env_vars": {"PYTHONPATH": str(REPO)}}
    own = {"env_vars": {"PYTHONPATH": str(project)}}
    r, _ = drive(ray_cluster, {"shim": True, "runtime_env": job, "actors": [None, own]})
    plain, moved = r["reports"]
    assert plain.get("installed") is True and plain["ray_route"] is True, f"the hook works where it can: {plain}"
    assert moved.get("answer") == 42, f"the actor must run as it does without the shim: {moved}"
    assert moved["loaded"] is False and moved["hook_env"] == plain["hook_env"], "the same job hook ran, and failed open"


def test_a_package_found_only_in_the_drivers_current_directory(ray_cluster: Cluster) -> None:
    args = {"shim": True, "runtime_env": {}, "actors": [None]}
    r, _ = drive(ray_cluster, args, pythonpath=None, cwd=REPO, module=True)  # python -m tests.support.ray_driver
    (report,) = r["reports"]
    assert report.get("answer") == 42, f"the job must run as it does without the shim: {report}"
    assert report["hook_env"].startswith("ray_runtime_env_func::"), "the hook was added, and failed open"
