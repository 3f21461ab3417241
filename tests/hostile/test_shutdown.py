"""An offload at interpreter shutdown runs the original, as without the shim (issue 27, finding 4).

During teardown Python sets module globals to None, the shim's included, while destructors still
run: cleanup code that offloads from a `__del__` reached the wrapper with its state gone, which
raised (`'NoneType' object has no attribute 'depth'`) and never ran the original. The shim steps
aside then. The script runs in a fresh interpreter, once with the shim and once without.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import child_env

SCRIPT = """\
import sys
import torch  # noqa: F401  (with torch loaded the modules are torn down as in a training job)
import holder  # imported before the shim: its objects outlive the shim's module globals
if sys.argv[1] == "shim":
    import te_offload_shim
import shutdown_target


class Cleanup:
    def __init__(self):
        self.offload = shutdown_target.offload  # what a destructor holds on to

    def __del__(self):
        print("returned", self.offload(["model"]), flush=True)


shutdown_target.offload(["model"])  # with the shim: patched, its handler loaded
holder.KEEP.append(Cleanup())
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "holder.py").write_text("KEEP = []\n")
    (tmp_path / "shutdown_target.py").write_text(
        "def offload(models):\n    print('original ran', flush=True)\n    return 'offloaded'\n"
    )
    (tmp_path / "main.py").write_text(SCRIPT)
    env = child_env({"TE_OFFLOAD_SHIM_TARGETS": "shutdown_target:offload"}, path=[tmp_path])
    return subprocess.run(
        [sys.executable, str(tmp_path / "main.py"), mode], capture_output=True, text=True, env=env, timeout=120
    )


def test_an_offload_from_a_destructor_at_shutdown_runs_the_original(tmp_path: Path) -> None:
    without = _run(tmp_path, "plain")
    assert without.stdout.splitlines() == ["original ran", "original ran", "returned offloaded"], without
    shimmed = _run(tmp_path, "shim")
    assert "Exception ignored" not in shimmed.stderr, shimmed.stderr
    assert shimmed.stdout == without.stdout, (shimmed.stdout, shimmed.stderr)
    assert shimmed.returncode == without.returncode == 0
