"""Scenario 14: when the shim does not work, it says so: a target that cannot be patched logs one
WARNING when its module is imported and makes `status` unhealthy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, child_env
from hostile_util import use_targets

BAD_TARGETS = "shim_targets:offload@model,shim_targets:ofload"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": BAD_TARGETS})
def test_a_target_that_cannot_be_patched_warns_once_on_import(caplog: pytest.LogCaptureFixture) -> None:
    import importlib

    import te_offload_shim

    use_targets()
    with caplog.at_level("WARNING", logger="te_offload_shim"):
        importlib.import_module("shim_targets")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert any("shim_targets:offload" in w and "names no parameter" in w for w in warnings)
    assert any("shim_targets:ofload" in w and "has no attribute ofload" in w for w in warnings)
    rows = {r["name"]: r for r in te_offload_shim.status()["targets"]}
    assert rows["shim_targets:offload"]["state"] == "error"
    assert rows["shim_targets:offload"]["detail"].startswith("models spec 'model'")
    states = {name: row["state"] for name, row in rows.items()}
    assert states["shim_targets:ofload"] == "absent"


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = child_env(env, path=[Path(__file__).resolve().parent / "targets"])
    command = [sys.executable, "-m", "te_offload_shim", "status", "--json", *args]
    return subprocess.run(command, capture_output=True, text=True, env=full, cwd=REPO, timeout=120)


def test_status_is_unhealthy_for_a_target_that_cannot_be_patched() -> None:
    proc = _status({"TE_OFFLOAD_SHIM_TARGETS": BAD_TARGETS}, "--import")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and not report["healthy"]
    problems = " ".join(report["problems"])
    assert "shim_targets:offload" in problems and "names no parameter" in problems
    assert "shim_targets:ofload" in problems and "ofload" in problems
