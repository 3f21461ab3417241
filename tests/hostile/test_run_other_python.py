"""Scenario 13: `te-offload-shim run -- pythonX.Y ...` started from an environment of another Python.

`run` may add its bootstrap folder to the other interpreter's path and nothing else: that
environment's site-packages hold wrapt and C extensions built for the Python that ran `run`. Where
the package is not installed, the interpreter starts as it would without `run`: no shim, the
sitecustomize further down the path still runs, and `run` says so in one stderr line.

"This environment" is a site-packages folder holding a copy of the package and one module of its
own; the launcher is this interpreter with that folder on its path, as an installed console script is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

MARKER = "only_in_the_launchers_env"
RUN_FILES = REPO / "tests" / "run_files"


def _interpreter(minor: int) -> str | None:
    """python3.<minor> from PATH or pyenv, if that is really the version."""
    candidates = [shutil.which(f"python3.{minor}")]
    candidates += sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob(f"3.{minor}.*/bin/python3.{minor}"))
    for exe in filter(None, candidates):
        probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(minor):
            return exe
    return None


@pytest.mark.parametrize("minor", [m for m in (10, 12, 13) if m != sys.version_info[1]])
def test_run_adds_nothing_of_its_environment_to_another_python(minor: int, tmp_path: Path) -> None:
    other = _interpreter(minor)
    if other is None:
        pytest.skip(f"no python3.{minor} on this machine")
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "te_offload_shim", site / "te_offload_shim", ignore=shutil.ignore_patterns("__pycache__"))
    (site / f"{MARKER}.py").write_text("")
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITECUSTOMIZE = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    env["PYTHONPATH"] = str(user)
    launcher = [sys.executable, str(RUN_FILES / "console_launcher.py"), str(site)]  # the launcher's environment: site

    def child(*prefix: str) -> tuple[dict, str]:
        proc = subprocess.run(
            [*prefix, other, str(RUN_FILES / "other_python_child.py"), MARKER],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), proc.stderr

    plain, plain_err = child()
    under_run, run_err = child(*launcher, "run", "--")
    assert under_run["version"] == [3, minor]
    bootstrap = site / "te_offload_shim" / "activation" / "bootstrap"
    assert under_run["pythonpath"] == str(bootstrap) + os.pathsep + str(user)
    assert under_run["sys_path"] == plain["sys_path"], "run put something of its environment on the path"
    assert not under_run["marker"] and not under_run["shim"]
    assert under_run["user_sitecustomize"] == 1, "the sitecustomize further down still runs"
    assert plain_err == "", "the bootstrap says nothing where the package is not installed"
    # but `run` itself says, in one line, that the command runs without the shim (issue 36: never silent)
    assert run_err == f"te-offload-shim run: {other} cannot import te_offload_shim; the command runs without the shim\n"
