"""`te-offload-shim status` on the real verl releases and megatron-core of this environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO, verl_path

CLI = Path(sys.executable).with_name("te-offload-shim")


def _status(*flags: str, verl: str | None = None, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_"))}
    # This checkout first: the console script would otherwise import the installed (editable) copy.
    full["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([str(verl_path(verl))] if verl is not None else []))
    full.update(env or {})
    proc = subprocess.run(
        [str(CLI), "status", "--json", *flags], capture_output=True, text=True, env=full, timeout=180, cwd=REPO
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _rows(s: dict) -> dict[str, dict]:
    return {r["name"]: r for r in s["targets"]}


def _dist_info_version(verl: str) -> str:
    (info,) = verl_path(verl).glob("verl-*.dist-info")
    return info.name[len("verl-") : -len(".dist-info")]


@pytest.mark.subprocess(verl="0.8.0", fresh=True)
def test_status_reads_versions_without_importing_anything() -> None:
    from te_offload_shim import health

    s = health.collect()
    heavy = ("torch", "verl", "megatron", "wrapt", "ray")
    assert sorted(m for m in heavy if m in sys.modules) == [], (
        "status without --import must not import what it describes"
    )
    assert s["versions"]["verl"] == _dist_info_version("0.8.0") == "0.8.0"
    for name in ("megatron-core", "torch", "wrapt"):
        assert s["versions"][name] == metadata.version(name)
    assert s["versions"]["transformer-engine"] is None
    assert s["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    rows = _rows(s)
    verl = rows["verl"]
    assert verl["present"] is True and verl["version"] == "0.8.0" and verl["fixed_upstream"] is False
    assert verl["fixed_upstream_basis"] == "verl 0.8.0 < 0.9.0 (by version)"
    assert (verl["supported"], verl["in_supported"], verl["fixed_in"]) == (">=0.4.0", True, "0.9.0")
    assert verl["would_be_patched"] is True and verl["disabled"] is False
    mcore = rows["megatron-core"]
    assert mcore["present"] is True and mcore["version"] == metadata.version("megatron-core")
    assert mcore["would_be_patched"] is True
    for name in ("nemo-rl", "roll", "areal", "slime", "miles"):
        assert rows[name]["present"] is False and rows[name]["would_be_patched"] is False
    assert s["imported"] is False and s["healthy"] is True


@pytest.mark.parametrize("verl", ["0.8.0", "0.9.1"])
def test_status_import_reports_what_was_patched(verl: str) -> None:
    code, s, err = _status("--import", verl=verl)
    assert code == 0, err
    rows = _rows(s)
    row = rows["verl"]
    fixed = verl == "0.9.1"
    assert row["version"] == _dist_info_version(verl) and row["fixed_upstream"] is fixed
    assert row["in_supported"] is True
    # The declared `fixed_in` and the live check on the imported module (`fixed_marker`) agree.
    assert row["state"] == ("fixed upstream" if fixed else "patched")
    assert row["layers"] == (0 if fixed else 1) and row["imported"] is True
    assert row["would_be_patched"] is (not fixed)
    assert rows["megatron-core"]["state"] == "patched" and rows["megatron-core"]["layers"] == 1
    assert rows["nemo-rl"]["imported"] is False and rows["nemo-rl"]["state"] == "pending"
    assert s["hook_errors"] == [] and s["problems"] == [] and s["imported"] is True
    # What megatron's import warns is held back and reported after the status, not printed ahead of it.
    assert "not installed" not in err and "Warning" not in err, err
    assert any("Apex is not installed" in line for line in s["import_output"]), s["import_output"]


def test_status_disabled_target_and_bad_user_target() -> None:
    code, s, err = _status(verl="0.8.0", env={"TE_OFFLOAD_SHIM_DISABLE": "verl"})
    assert code == 0, err
    verl = _rows(s)["verl"]
    assert verl["disabled"] is True and verl["would_be_patched"] is False and verl["present"] is True
    assert s["switches"] == {"TE_OFFLOAD_SHIM_DISABLE": "verl"}
    assert s["disabled_by"] == {"verl": ["verl"]}

    code, s, err = _status(env={"TE_OFFLOAD_SHIM_TARGETS": "not a target"})
    assert code == 1 and s["healthy"] is False
    # The package's own warning at import, then the CLI's one-line reason.
    assert (
        err.strip().splitlines()[-1].startswith("te-offload-shim: unhealthy: TE_OFFLOAD_SHIM_TARGETS: 'not a target'")
    )
    assert s["user_target_problems"] and s["problems"][0].startswith("TE_OFFLOAD_SHIM_TARGETS")


def test_status_human_output() -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_"))}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), str(verl_path("0.8.0"))])
    full["TE_OFFLOAD_SHIM_DISABLE"] = "nemo-rl"  # a name also switches off its name-* variants: shown
    proc = subprocess.run([str(CLI), "status"], capture_output=True, text=True, env=full, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = lines[lines.index("targets:") + 1 : lines.index("activation routes:")]
    assert table[0].split()[:4] == ["target", "present", "version", "supported"]
    assert any(line.split()[:9] == "verl yes 0.8.0 yes (>=0.4.0) no (from 0.9.0) yes".split() for line in table)
    assert any(line.split()[:3] == ["nemo-rl-0.3", "no", "-"] and line.endswith("yes") for line in table)
    family = "nemo-rl, nemo-rl-after-refit, nemo-rl-0.5, nemo-rl-0.3 (its name-* variants included)"
    assert f"  TE_OFFLOAD_SHIM_DISABLE=nemo-rl switches off: {family}" in lines
    starts = {line.index(line.split()[1]) for line in table}  # the second column starts at one offset
    assert len(starts) == 1, "the table is aligned"
    assert "in force here:" in proc.stdout
    assert lines[-1] == "healthy"


def _status_text(*flags: str) -> list[str]:
    """The human report's target table (the lines between `targets:` and `activation routes:`), with
    megatron-core present and no verl on the path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_"))}
    full["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([str(CLI), "status", *flags], capture_output=True, text=True, env=full, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return lines[lines.index("targets:") + 2 : lines.index("activation routes:")]  # after the header


def test_status_shows_present_targets_and_sums_up_the_absent_ones_in_one_line() -> None:
    code, s, err = _status()
    assert code == 0, err
    present = [r["name"] for r in s["targets"] if r["present"]]
    absent = [r["name"] for r in s["targets"] if not r["present"]]
    assert "megatron-core" in present and "verl" in absent, "this environment: megatron-core without verl"
    assert len(s["targets"]) == len(present) + len(absent), "--json keeps every row"

    *rows, summary = _status_text()
    assert [line.split()[0] for line in rows] == present
    assert summary.split()[:3] == ["others", "no", str(len(absent))]
    assert summary.endswith("(every row: --all)") and all(name in summary for name in absent)

    every = _status_text("--all")
    assert [line.split()[0] for line in every] == present + absent, "--all: present first, then the rest"
