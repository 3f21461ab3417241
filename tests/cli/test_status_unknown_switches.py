"""`te-offload-shim status` lists the `TE_OFFLOAD_SHIM*` names set in its environment that are no
switch (a misspelt `TE_OFFLOAD_SHIM_DISABLED` switches nothing off), each with the closest real one:
in its JSON, and as one warning each."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, child_env

ENV = {"TE_OFFLOAD_SHIM_DISABLED": "verl", "TE_OFFLOAD_SHIM_STRICT": "0"}


def _status(*flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "te_offload_shim", "status", *flags]
    return subprocess.run(command, capture_output=True, text=True, env=child_env(ENV), cwd=REPO, timeout=120)


def test_status_lists_the_unknown_switch_names_with_the_closest_real_one() -> None:
    proc = _status("--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert report["unknown_switches"] == [
        {"name": "TE_OFFLOAD_SHIM_DISABLED", "value": "verl", "closest": "TE_OFFLOAD_SHIM_DISABLE"}
    ]
    assert report["switches"] == {"TE_OFFLOAD_SHIM_STRICT": "0"}, "the known switches, as before"
    assert (
        "TE_OFFLOAD_SHIM_DISABLED=verl is no switch of te_offload_shim and does nothing "
        "(did you mean TE_OFFLOAD_SHIM_DISABLE?)"
    ) in report["warnings"]


WARNED = "warning: {} is no switch of te_offload_shim and does nothing (did you mean TE_OFFLOAD_SHIM_DISABLE?)"


def test_the_human_report_warns_of_each_unknown_name_once() -> None:
    proc = _status()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert WARNED.format("TE_OFFLOAD_SHIM_DISABLED=verl") in lines
    assert sum("TE_OFFLOAD_SHIM_DISABLED" in line for line in lines) == 1, "said once, not in the routes too"
    assert "  switches:                         TE_OFFLOAD_SHIM_STRICT=0" in lines, "the known switches, as before"
    assert lines[-1] == "healthy"


def test_a_switch_name_that_is_not_utf8_is_listed_escaped() -> None:
    """Non-UTF-8 bytes in a name (and its value), under a strict UTF-8 stdout: listed, escaped, exit 0."""
    env = {os.fsencode(k): os.fsencode(v) for k, v in child_env({"PYTHONIOENCODING": "utf-8"}).items()}
    env[b"TE_OFFLOAD_SHIM_DISABLE\xff"] = b"verl\xfe"
    command = [sys.executable, "-m", "te_offload_shim", "status"]
    proc = subprocess.run(command, capture_output=True, env=env, cwd=REPO, timeout=120)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert WARNED.format("TE_OFFLOAD_SHIM_DISABLE\\udcff=verl\\udcfe") in proc.stdout.decode().splitlines()
