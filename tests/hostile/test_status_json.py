"""`te-offload-shim status --import --json` prints one JSON document, whatever the targets' imports
print: a C extension's printf, a subprocess it runs and a write to file descriptor 1 bypass Python's
sys.stdout (tests/hostile/targets/noisy_import.py does all three). What they printed is in the report
(`import_output`), not ahead of it or behind it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, child_env

TARGETS = Path(__file__).resolve().parent / "targets"
NOISE = [
    "noisy_import: written to file descriptor 1",
    "noisy_import: printf from C",
    "noisy_import: from a subprocess",
    "noisy_import: print",
]


def _status(python: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = child_env({"TE_OFFLOAD_SHIM_TARGETS": "noisy_import:offload"}, path=[TARGETS])
    command = [str(python), "-m", "te_offload_shim", "status", "--import", *flags]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_status_import_json_is_one_json_document_whatever_the_imports_print(checkout_python: Path) -> None:
    proc = _status(checkout_python, "--json")
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one JSON document:\n{proc.stdout[:2000]}")
    assert proc.returncode == 0, proc.stderr
    assert sorted(line for line in report["import_output"] if line.startswith("noisy_import")) == sorted(NOISE)
    row = {r["name"]: r for r in report["targets"]}["noisy_import:offload"]
    assert row["state"] == "patched" and row["import_error"] is None


def test_status_import_shows_what_the_imports_printed_after_the_report(checkout_python: Path) -> None:
    lines = _status(checkout_python).stdout.splitlines()
    assert lines[0].startswith("te-offload-shim "), "nothing ahead of the report"
    assert lines[-1] == "healthy"
    shown = [line.removeprefix("  | ") for line in lines if line.startswith("  | ")]
    assert sorted(line for line in shown if line.startswith("noisy_import")) == sorted(NOISE)


@pytest.mark.parametrize("refused", ["scratch file", "descriptor 1"])
def test_where_descriptor_1_cannot_be_held_what_reaches_it_goes_where_it_was_going(
    refused: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """No scratch file (no memory file, no usable temporary folder), or no descriptor 1 to save: the
    imports run with descriptor 1 as it is, nothing is held back, and a scratch file made is closed."""
    import os
    from unittest import mock

    from te_offload_shim import health

    made: list[Any] = []
    sink: list[str] = []

    def scratch() -> Any:
        made.append(real_scratch())
        return made[-1]

    def refuse(*args: object) -> None:
        raise OSError("refused")

    real_scratch = health._scratch_file
    with (
        mock.patch.object(health, "_scratch_file", refuse if refused == "scratch file" else scratch),
        mock.patch.object(health.os, "dup", refuse if refused == "descriptor 1" else os.dup),
        health._descriptor_1_held(sink),
    ):
        os.write(1, b"straight to descriptor 1\n")
    assert sink == [] and "straight to descriptor 1" in capfd.readouterr().out
    assert [f.closed for f in made] == ([True] if refused == "descriptor 1" else [])
