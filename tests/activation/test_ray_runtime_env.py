"""The rule that decides whether `ray.init` gains our setup hook (integrations/ray_runtime_env.py
`hook_blockers`, a pure function: one case per way a runtime_env can keep the workers from the
package), and the hook itself: pickled by value, it loads and returns where the package is missing.
The same cases on a real cluster: tests/hostile/test_ray_workers.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from support.ray_session import bare_python, clean_env
from support.set_up import needs

from te_offload_shim.integrations import ray_runtime_env as rre

CHECKOUT = "/src/checkout"  # where the driver imports te_offload_shim from, in these cases
DRIVER = {"PYTHONPATH": f"{CHECKOUT}:/opt/libs", "HOME": "/home/me"}


def _blockers(runtime_env: dict[str, Any], kind: str = "pythonpath", submitted: dict | None = None) -> list[str]:
    # a package found in the script's folder is not on the driver's PYTHONPATH (or it would count as found there)
    environ = {**DRIVER, "PYTHONPATH": "/opt/libs"} if kind == "script" else DRIVER
    return rre.hook_blockers(runtime_env, submitted, rre.Origin(CHECKOUT, kind, environ))


def _env_vars(**values: str) -> dict[str, Any]:
    return {"env_vars": values}


@pytest.mark.parametrize(
    ("runtime_env", "kind"),
    [
        ({}, "pythonpath"),  # workers inherit the driver's PYTHONPATH (a cluster ray.init starts here)
        ({}, "site"),
        (_env_vars(PYTHONPATH="/project"), "site"),  # site-packages does not move with PYTHONPATH
        (_env_vars(PYTHONPATH=f"/project:{CHECKOUT}"), "pythonpath"),
        (_env_vars(PYTHONPATH=f"{CHECKOUT}/"), "pythonpath"),  # the same folder, spelt otherwise
        (_env_vars(PYTHONPATH="/project:${PYTHONPATH}"), "pythonpath"),  # Ray expands from the raylet's env
        (_env_vars(PYTHONPATH="/project:$PYTHONPATH"), "pythonpath"),
        ({**_env_vars(PYTHONPATH="/project"), "py_modules": [f"{CHECKOUT}/te_offload_shim"]}, "pythonpath"),
        ({**_env_vars(PYTHONPATH="/project"), "working_dir": CHECKOUT}, "pythonpath"),
        ({**_env_vars(PYTHONPATH="/project"), "py_modules": ["/other"]}, "pythonpath"),  # + the cluster's own path
        (_env_vars(PYTHONPATH=CHECKOUT), "script"),  # a package in the driver's folder, given to the workers
        ({"working_dir": "gcs://_ray_pkg_abc.zip"}, "script"),  # a submitted job runs inside its working_dir
        (_env_vars(PYTHONNOUSERSITE="1"), "site"),  # only a user-site install is lost
        (_env_vars(HOME="/elsewhere"), "pythonpath"),
        (_env_vars(PYTHONUSERBASE="/home/me/.local"), "site"),
        (_env_vars(TE_OFFLOAD_SHIM="0", OMP_NUM_THREADS="8"), "pythonpath"),
    ],
)
def test_workers_that_can_import_the_package_get_the_hook(runtime_env: dict[str, Any], kind: str) -> None:
    assert _blockers(runtime_env, kind) == []


@pytest.mark.parametrize(
    ("runtime_env", "kind", "reason"),
    [
        (_env_vars(PYTHONPATH="/project"), "pythonpath", "env_vars PYTHONPATH='/project', without the folder"),
        (_env_vars(PYTHONPATH="checkout"), "pythonpath", "env_vars PYTHONPATH='checkout', without"),  # relative
        (_env_vars(PYTHONPATH="/project:${NOT_SET}"), "pythonpath", "env_vars PYTHONPATH='/project:${NOT_SET}'"),
        ({}, "script", "a package found only in the script's folder or the current directory (/src/checkout)"),
        (_env_vars(PYTHONPATH="/project"), "script", "env_vars PYTHONPATH='/project', without the folder"),
        (_env_vars(PYTHONHOME="/opt/python"), "site", "env_vars PYTHONHOME='/opt/python' (another Python"),
        (_env_vars(PYTHONNOUSERSITE="1"), "user-site", "env_vars PYTHONNOUSERSITE='1'"),
        (_env_vars(PYTHONUSERBASE="/scratch/u"), "user-site", "env_vars PYTHONUSERBASE='/scratch/u', which moves"),
        (_env_vars(HOME="/scratch/home"), "user-site", "env_vars HOME='/scratch/home', which moves the user site"),
        ({"pip": ["torch"]}, "site", "runtime_env sets pip (another Python environment)"),
        ({"py_executable": "/venvs/mcore/bin/python"}, "site", "runtime_env sets py_executable"),
        ({"conda": "env"}, "site", "runtime_env sets conda"),
    ],
)
def test_workers_that_cannot_import_the_package_keep_the_hook_out(
    runtime_env: dict[str, Any], kind: str, reason: str
) -> None:
    found = _blockers(runtime_env, kind)
    assert len(found) == 1 and found[0].startswith(reason), found


def test_a_submitted_jobs_runtime_env_counts_and_ray_inits_env_vars_win() -> None:
    assert _blockers({}, submitted=_env_vars(PYTHONPATH="/project"))[0].startswith("env_vars PYTHONPATH='/project'")
    assert _blockers(_env_vars(PYTHONPATH=CHECKOUT), submitted=_env_vars(PYTHONPATH="/project")) == []
    assert _blockers({}, submitted={"uv": ["x"]}) == ["runtime_env sets uv (another Python environment)"]


def test_odd_values_give_an_answer_not_an_error() -> None:
    assert _blockers({"env_vars": None, "py_modules": None}) == []
    assert _blockers({"env_vars": {"PYTHONPATH": 7}})[0].startswith("env_vars PYTHONPATH='7'")


def test_our_hook_is_recognised_by_name_and_by_value() -> None:
    assert rre.is_ours(rre.worker_hook()) and rre.is_ours("te_offload_shim.ray_setup") and rre.is_ours(rre.HOOK_NAME)
    assert not rre.is_ours("user_hook.setup") and not rre.is_ours(print) and not rre.is_ours(None)


def test_the_hook_pickles_by_value_and_fails_open_where_the_package_is_missing(tmp_path: Path) -> None:
    import cloudpickle  # Ray's own ray.cloudpickle is a vendored copy of it

    blob = tmp_path / "hook.pickle"
    blob.write_bytes(cloudpickle.dumps(rre.worker_hook()))
    python = bare_python(tmp_path / "venv")  # cloudpickle, no te_offload_shim
    loader = REPO / "tests" / "run_files" / "call_pickled.py"
    missing = subprocess.run([python, loader, blob], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert (missing.returncode, missing.stdout) == (0, "returned\n"), missing.stderr
    assert missing.stderr == (
        "te_offload_shim: this Ray worker cannot import te_offload_shim (ModuleNotFoundError: No module named "
        "'te_offload_shim'); it runs without the shim. Install te-offload-shim in this worker's Python environment "
        "to have it here.\n"
    )
    off = subprocess.run(
        [python, loader, blob], capture_output=True, text=True, env={**clean_env(), "TE_OFFLOAD_SHIM": "0"}, timeout=60
    )
    assert (off.returncode, off.stdout, off.stderr) == (0, "returned\n", ""), "switched off: not a word"
    there = subprocess.run(
        [python, loader, blob, "--report"],
        capture_output=True, text=True, env={**clean_env(), "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert there.returncode == 0 and there.stderr == "", there.stderr
    assert there.stdout.splitlines() == ["returned", "installed True", "ray route True"]


@pytest.mark.subprocess()
def test_a_package_installed_here_counts_as_site_packages_though_pythonpath_finds_it_first() -> None:
    """This test's interpreter imports the package from this checkout on PYTHONPATH; this venv's
    (editable) install gives it to the workers of a cluster running this interpreter all the same."""
    from importlib import metadata

    try:
        installed = bool(metadata.distribution("te-offload-shim"))
    except metadata.PackageNotFoundError:
        installed = False
    needs(installed, "te-offload-shim is not installed in this environment (only on PYTHONPATH)")
    found = rre.origin()
    assert found.root == str(REPO) and found.kind == "site"
