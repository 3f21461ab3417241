"""`te-offload-shim status --import` reports a target module whose import fails, whatever the way it
fails, and goes on with the others: research code that parses `sys.argv` with argparse at import
exits (`SystemExit`), and its usage message is part of the report, not lost in the capture."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO, child_env

EXITS = """\
import argparse

parser = argparse.ArgumentParser(prog="train.py")
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()  # at import, as research code does: `status --import` is no training command


def offload(models):
    return models
"""
FINE = "def offload(models):\n    return models\n"
TARGETS = "exits_at_import:offload,imports_fine:offload"


def _status(python: Path, folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (folder / "exits_at_import.py").write_text(EXITS)
    (folder / "imports_fine.py").write_text(FINE)
    env = child_env({"TE_OFFLOAD_SHIM_TARGETS": TARGETS}, path=[folder])
    command = [str(python), "-m", "te_offload_shim", "status", "--import", *flags]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_a_target_module_that_exits_at_import_is_reported_and_the_others_are_checked(
    checkout_python: Path, tmp_path: Path
) -> None:
    proc = _status(checkout_python, tmp_path, "--json")
    assert proc.stdout, f"nothing on stdout (exit {proc.returncode}); stderr: {proc.stderr!r}"
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in report["targets"]}
    failed = rows["exits_at_import:offload"]
    assert failed["import_error"].startswith("SystemExit: exit code 2"), failed["import_error"]
    assert "unrecognized arguments: status --import --json" in failed["import_error"], "its usage message kept"
    assert rows["imports_fine:offload"]["state"] == "patched", "the targets after it are still imported"
    assert any(w.startswith("exits_at_import:offload: import failed: SystemExit") for w in report["warnings"])
    assert any("usage: train.py" in line for line in report["import_output"])


def test_the_human_report_names_the_exit_and_ends_with_the_verdict(checkout_python: Path, tmp_path: Path) -> None:
    proc = _status(checkout_python, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and lines[0].startswith("te-offload-shim "), proc.stdout
    assert any(
        line.startswith("warning: exits_at_import:offload: import failed: SystemExit: exit code 2") for line in lines
    )
    assert lines[-1] == "healthy"
