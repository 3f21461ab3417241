"""`te-offload-shim run -- pythonX ...` where pythonX is an old interpreter: Python 2.7 (a tool's own
interpreter, an old system python) or 3.6 - 3.9, below the package's own minimum. Every one of them
imports the bootstrap `sitecustomize` at start-up, so it must parse there and fall through: no
"'import sitecustomize' failed", and the user's own sitecustomize further down the path still runs,
exactly as without `run`. (3.10+ is tests/hostile/test_run_other_python.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

RUN_FILES = REPO / "tests" / "run_files"
OLD = ("2.7", "3.6", "3.7", "3.8", "3.9")
# The user's sitecustomize, in syntax each old interpreter reads; it speaks only in the old one (the
# launcher, this interpreter, runs it too)
USER_SITECUSTOMIZE = """import os, sys
if os.environ.get("TEST_OLD_PYTHON") == "%d.%d" % sys.version_info[:2]:
    sys.stdout.write("the user sitecustomize ran\\n")
"""


def _interpreter(version: str) -> str | None:
    """pythonX.Y from PATH or pyenv, if that is really the version."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"))
    for exe in filter(None, candidates):
        probe = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return exe
    return None


@pytest.mark.parametrize("version", OLD)
def test_an_old_python_under_run_starts_as_it_would_without_it(version: str, tmp_path: Path) -> None:
    old = _interpreter(version)
    if old is None:
        pytest.skip(f"no python{version} on this machine")
    site = tmp_path / "site-packages"  # the launcher's environment: a copy of the package
    shutil.copytree(REPO / "te_offload_shim", site / "te_offload_shim", ignore=shutil.ignore_patterns("__pycache__"))
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    env["PYTHONPATH"] = str(user)
    env["TEST_OLD_PYTHON"] = version
    launcher = [sys.executable, str(RUN_FILES / "console_launcher.py"), str(site), "run", "--"]

    def start(*prefix: str) -> subprocess.CompletedProcess[str]:
        command = [*prefix, old, "-c", "import sys; sys.stdout.write('%d.%d\\n' % sys.version_info[:2])"]
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)

    plain, under_run = start(), start(*launcher)
    assert plain.returncode == 0 and plain.stdout == f"the user sitecustomize ran\n{version}\n", plain
    assert plain.stderr == "", plain.stderr
    # the bootstrap parses there and says nothing; `run` itself says, in its one line, that this
    # interpreter cannot import the package (the package needs 3.10+), and runs the command unchanged
    said = f"te-offload-shim run: {old} cannot import te_offload_shim; the command runs without the shim\n"
    assert under_run.stderr == said, "the bootstrap must parse and stay silent on this Python"
    assert (under_run.returncode, under_run.stdout) == (0, plain.stdout), "its own sitecustomize still runs"
