"""`te-offload-shim run -- CMD`: the sitecustomize bootstrap reaches child processes, keeps the
user's PYTHONPATH, and still runs the sitecustomize it shadows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

CLI = Path(sys.executable).with_name("te-offload-shim")
BOOTSTRAP = str(REPO / "te_offload_shim" / "activation" / "bootstrap")

FILES = REPO / "tests" / "run_files"  # child.py, sitecustomize.py, probe.py: copied or run by path


def _run(*cmd: object, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    full.update(env)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=full, timeout=120, cwd=cwd)


@pytest.fixture
def user_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Two user folders for PYTHONPATH; the second holds a sitecustomize of the user's own."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    shutil.copy(FILES / "sitecustomize.py", second / "sitecustomize.py")
    shutil.copy(FILES / "child.py", tmp_path / "child.py")
    return first, second


def _check_process(r: dict, user_path: str, second: Path, *, active: bool) -> None:
    assert r["loaded"] is active and r["installed"] is active
    assert r["user_sitecustomize"] == 1, "the shadowed sitecustomize runs, once"
    assert r["sitecustomize"] == str(second / "sitecustomize.py")
    assert r["pythonpath"] == BOOTSTRAP + os.pathsep + user_path, "the user's PYTHONPATH is kept, ours in front"
    entries = [p for p in r["sys_path"] if p in user_path.split(os.pathsep)]
    assert entries == user_path.split(os.pathsep), "every user entry stays on sys.path, in order"
    assert BOOTSTRAP not in r["sys_path"]


def test_run_reaches_child_and_spawned_grandchild_and_chains_sitecustomize(user_dirs: tuple[Path, Path]) -> None:
    first, second = user_dirs
    user_path = f"{first}{os.pathsep}{second}"
    proc = _run(CLI, "run", "--", sys.executable, "child.py", env={"PYTHONPATH": user_path}, cwd=first.parent)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    _check_process(r, user_path, second, active=True)
    _check_process(r["spawned"], user_path, second, active=True)


def test_run_honours_the_off_switch(user_dirs: tuple[Path, Path]) -> None:
    first, second = user_dirs
    user_path = f"{first}{os.pathsep}{second}"
    env = {"PYTHONPATH": user_path, "TE_OFFLOAD_SHIM": "0"}
    proc = _run(CLI, "run", "--", sys.executable, "child.py", env=env, cwd=first.parent)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    _check_process(r, user_path, second, active=False)
    _check_process(r["spawned"], user_path, second, active=False)


def test_run_without_a_user_sitecustomize_or_pythonpath(tmp_path: Path) -> None:
    probe = FILES / "probe.py"
    proc = _run(sys.executable, "-m", "te_offload_shim", "run", "--", sys.executable, probe, env={}, cwd=tmp_path)
    assert json.loads(proc.stdout) == [BOOTSTRAP, True], proc.stderr


def test_run_passes_exit_status_and_reports_a_missing_command(tmp_path: Path) -> None:
    proc = _run(CLI, "run", "--", sys.executable, "-c", "raise SystemExit(3)", env={}, cwd=tmp_path)
    assert proc.returncode == 3
    proc = _run(CLI, "run", "--", "te-offload-shim-no-such-command", env={}, cwd=tmp_path)
    assert proc.returncode == 127 and "cannot run 'te-offload-shim-no-such-command'" in proc.stderr
    proc = _run(CLI, "run", env={}, cwd=tmp_path)
    assert proc.returncode == 2 and "no command given" in proc.stderr


def test_status_under_run(user_dirs: tuple[Path, Path]) -> None:
    first, second = user_dirs
    env = {"PYTHONPATH": str(second), "VERL_USE_EXTERNAL_MODULES": "other_mod, te_offload_shim"}
    proc = _run(CLI, "run", "--", CLI, "status", "--json", env=env, cwd=first.parent)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["routes"]["sitecustomize_bootstrap"] is True
    assert s["routes"]["verl_external_modules"] is True
    assert s["routes"]["ray_worker_setup_hook"] is False
    assert s["healthy"] is True and s["routes"]["in_force"] == "sitecustomize bootstrap, VERL_USE_EXTERNAL_MODULES"
    # Outside `run` the same command sees no bootstrap route.
    proc = _run(CLI, "status", "--json", env={"PYTHONPATH": str(second)}, cwd=first.parent)
    s = json.loads(proc.stdout)
    assert s["routes"]["sitecustomize_bootstrap"] is False and s["routes"]["verl_external_modules"] is False
