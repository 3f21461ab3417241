"""The rule that decides whether `ray.init` gains our setup hook (integrations/ray_runtime_env.py
`env_swapping`: not where the workers get another Python environment), and the hook itself: pickled
by value, it loads and returns where the package is missing. On a real cluster:
tests/hostile/test_ray_workers.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from support.ray_session import bare_python, clean_env

from te_offload_shim.integrations import ray_runtime_env as rre


@pytest.mark.parametrize("field", rre.ENV_SWAPPING)
def test_a_runtime_env_with_another_python_environment_keeps_the_hook_out(field: str) -> None:
    assert rre.env_swapping({field: "x"}, None) == [field]
    assert rre.env_swapping({}, {field: "x"}) == [field], "a submitted job's runtime_env counts too"


@pytest.mark.parametrize(
    "runtime_env",
    [{}, {"env_vars": {"PYTHONPATH": "/project"}}, {"working_dir": "/src"}, {"pip": []}, {"env_vars": None}],
)
def test_any_other_runtime_env_gets_the_hook(runtime_env: dict[str, Any]) -> None:
    """A PYTHONPATH without us, a working_dir: the hook fails open in the worker (the last test)."""
    assert rre.env_swapping(runtime_env, None) == []


def test_our_hook_is_recognised_by_name_and_by_value() -> None:
    assert rre.is_ours(rre.worker_hook()) and rre.is_ours("te_offload_shim.ray_setup") and rre.is_ours(rre.HOOK_NAME)
    assert not rre.is_ours("user_hook.setup") and not rre.is_ours(print) and not rre.is_ours(None)


def test_the_hook_pickles_by_value_and_fails_open_where_the_package_is_missing(tmp_path: Path) -> None:
    """Where the package is missing, the hook says so in one line, with `[rank N]` as every line of
    the package has it (read from the variables `_switches.rank()` reads, written out in the hook:
    the package is what cannot be imported there), and returns."""
    import cloudpickle  # Ray's own ray.cloudpickle is a vendored copy of it

    from te_offload_shim import _switches
    from te_offload_shim.activation import ray_worker

    assert _switches.RANK_VARIABLES in ray_worker.setup_worker.__code__.co_consts, "the same variables, in order"

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
    for ranks, said in [
        ({"RANK": "3"}, "[rank 3] "),
        ({"SLURM_PROCID": "07"}, "[rank 7] "),
        ({"RANK": "-1", "OMPI_COMM_WORLD_RANK": "2"}, "[rank 2] "),  # no rank: the next variable is asked
        ({"PMI_RANK": "\u00b2"}, ""),  # a digit to str.isdigit, no number to int()
    ]:
        ranked = subprocess.run(
            [python, loader, blob], capture_output=True, text=True, env={**clean_env(), **ranks}, timeout=60
        )
        assert (ranked.returncode, ranked.stdout) == (0, "returned\n"), ranked.stderr
        assert ranked.stderr == missing.stderr.replace("te_offload_shim: ", f"te_offload_shim: {said}", 1), ranks
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
