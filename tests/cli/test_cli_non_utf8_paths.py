"""The CLI prints a path whatever its bytes: a site folder whose name is not UTF-8 (a file system
mounted from another system, a name made by a script) under a strict UTF-8 standard output (a UTF-8
locale, `PYTHONIOENCODING=utf-8`) is shown with the bytes it cannot encode escaped, and the command
that succeeded exits 0 without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, child_env


def _cli(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    env = child_env({"PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"})  # strict: no surrogateescape
    command = [sys.executable, "-m", "te_offload_shim", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def test_enable_and_disable_on_a_site_whose_name_is_not_utf8(tmp_path: Path) -> None:
    site = os.fsencode(tmp_path) + b"/site-\xff\xfe"
    os.mkdir(site)
    shown = f"{tmp_path}/site-\\udcff\\udcfe/te_offload_shim.pth"

    enabled = _cli("enable", "--site", site)
    assert (enabled.returncode, enabled.stderr) == (0, ""), enabled.stderr
    assert enabled.stdout.splitlines() == [f"te-offload-shim: enabled: {shown}"]
    assert os.path.isfile(site + b"/te_offload_shim.pth")

    disabled = _cli("disable", "--site", site)
    assert (disabled.returncode, disabled.stderr) == (0, ""), disabled.stderr
    assert disabled.stdout.splitlines()[0] == f"te-offload-shim: disabled: {shown}"
    assert not os.path.exists(site + b"/te_offload_shim.pth")
