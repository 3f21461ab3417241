"""`te-offload-shim selftest` (te_offload_shim/selftest/): every exit status, on the CPU twin.

The command runs here as on a GPU node: it starts its two measuring processes itself (the clearing
off, then on). harness/twin_site/, first on their PYTHONPATH, loads into each of them TE 2.20.2 on
the twin (the shim first, as a job's start-up gives it) and runs the selftest's offload under the
twin's host scope, so that what it moves to the CPU answers as a host tensor does on a GPU
(harness/te_twin/host.py); or only the twin's GPU answers, with no TE. The driver's and the
allocator's figures, which the twin cannot give, must read "not measured". How the verdict weighs
measured figures is checked on the command's own judgement (`judge`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import REPO, child_env

SITE = REPO / "harness" / "twin_site"
SMALL = ("--mib", "0.1", "--hidden", "128")  # four 128-wide layers: 128 KiB of caches


def _selftest(*args: str, site: str | None = "2.20.2", env: dict[str, str] | None = None) -> Any:
    extra = {**({"TE_TWIN_SITE": site} if site else {}), **(env or {})}
    command = [sys.executable, "-m", "te_offload_shim", "selftest", *SMALL, *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=child_env(extra, path=[SITE] if site else []),
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.parametrize(("site", "recipe"), [("2.20.2", "DelayedScaling"), ("2.20.2:100", "MXFP8BlockScaling")])
def test_the_clearing_drops_every_cache_at_the_flush_and_the_next_forward_is_bit_identical(
    site: str, recipe: str
) -> None:
    """Exit 0: TE's own `Linear` layers (sm90: delayed scaling; sm100: MXFP8, TE's answer for that
    GPU) hold the cache bytes asked for; verl's offload and flush keep them all with the clearing off
    and leave none with it on (the net's count is their bytes); the forward after the reload is
    the bits of the run that kept them. The driver's figures are not measured, and say so."""
    proc = _selftest("--json", site=site)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    off, on = report["off"], report["on"]
    assert off["recipe"] == on["recipe"] == recipe and on["te"] == "2.20.2", report
    made = off["caches"]
    assert made["entries"] == off["layers"] == 4 and made["bytes"] >= 0.1 * 2**20, made
    assert off["left"] == made, "with the clearing off every cache stays through the flush"
    assert on["caches"] == made and on["left"] == {"entries": 0, "bytes": 0}, on
    assert on["net_bytes"] == made["bytes"] and on["shim"]["net"] == "armed" and not off["shim"]["enabled"]
    assert report["bit_identical"] is True and on["output"] == off["output"]
    assert report["cache_bytes"] == made["bytes"] and report["handed_back"] == report["share"] == "not measured"
    for run in (off, on):
        assert set(run["before"].values()) == set(run["after"].values()) == {"not measured"}, run
    assert proc.stderr.strip().splitlines()[-1].startswith("te-offload-shim selftest: OK: ")


@pytest.mark.parametrize(
    ("switch", "why"),
    [
        ("TE_OFFLOAD_SHIM_NET", "the flush net is off: TE_OFFLOAD_SHIM_NET=0 when TE was imported"),
        ("TE_OFFLOAD_SHIM", "the shim is switched off in this environment (TE_OFFLOAD_SHIM=0)"),
    ],
)
def test_the_clearing_switched_off_in_the_environment_hands_back_nothing_and_exits_1(switch: str, why: str) -> None:
    """Exit 1: an environment that switches the clearing off (the net, or the whole shim) keeps every
    cache in the run that should have cleared; the last line says which switch. The table shows
    the caches left and "not measured" for the driver's figures."""
    proc = _selftest(env={switch: "0"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("te-offload-shim selftest: FAILED: the clearing left 4 of 4 FP8 caches (" + why), last
    table = proc.stdout.splitlines()
    (left,) = [line.split() for line in table if line.strip().startswith("FP8 caches left")]
    assert left[-2:] == ["4", "4"], table
    assert [line.split("  ")[-1].strip() for line in table if line.strip().startswith("driver free")] == [
        "not measured"
    ]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("site", "args", "said"),
    [
        (None, (), "no GPU: torch "),
        ("device", (), "no TE: transformer_engine.pytorch does not import here (ModuleNotFoundError"),
        ("2.20.2", ("--recipe", "mxfp8"), "no FP8 on this GPU: MXFP8BlockScaling: "),
    ],
    ids=["no-gpu", "no-te", "no-mxfp8-on-sm90"],
)
def test_a_machine_that_cannot_run_it_exits_2_saying_which(site: str | None, args: tuple[str, ...], said: str) -> None:
    """Exit 2, one line, no figures: no GPU (this CPU machine's torch), a GPU without TE (the
    twin's GPU answers alone: what a GPU machine without Transformer Engine gives), and a recipe
    TE says this GPU lacks (MXFP8 on sm90, TE's own reason). `--json` says the same."""
    proc = _selftest(*args, site=site)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"te-offload-shim selftest: cannot run here: {said}"), line
    assert len(line) > len(said) + 44, "the reason is said"
    report = json.loads(_selftest("--json", *args, site=site).stdout)
    assert report["exit"] == 2 and report["verdict"].startswith(said) and set(report) == {"exit", "verdict", "off"}


def _run(left: int, freed: int | None, output: str = "same") -> dict[str, Any]:
    """A measuring process's figures: 2 caches of 1 MiB each made, `left` of them after the flush,
    the driver's free memory risen by `freed` bytes (None: not measured)."""
    free: dict[str, int | None] = {"free": None, "allocated": None, "reserved": None}
    before, after = dict(free), dict(free)
    if freed is not None:
        before["free"], after["free"] = 10 * 2**30, 10 * 2**30 + freed
    return {
        "caches": {"entries": 2, "bytes": 2**21},
        "left": {"entries": left, "bytes": left * 2**20},
        "before": before,
        "after": after,
        "output": output,
        "shim": {"enabled": True, "net": "armed", "detail": ""},
    }


def test_the_verdict_on_measured_figures_asks_the_driver_for_the_cache_bytes() -> None:
    """Where the driver's figures are measured, exit 0 needs at least 90% of the cache bytes back
    beyond what the run that kept its caches got back (the weights); caches dropped that the driver
    never saw back, a forward after the reload that differs, or no caches at all, exit 1."""
    from te_offload_shim.selftest.command import judge

    weights = 64 * 2**20
    code, verdict, figures = judge({"off": _run(2, weights), "on": _run(0, weights + 2**21)})
    assert (code, figures["handed_back"], figures["share"]) == (0, 2**21, 1.0)
    assert verdict == "the clearing handed 2.00 MiB of 2.00 MiB of FP8 caches back to the driver"
    code, verdict, _ = judge({"off": _run(2, weights), "on": _run(0, weights + 2**20)})
    assert (code, verdict) == (1, "the driver got back 1.00 MiB of 2.00 MiB of caches (50.0%)")
    code, verdict, _ = judge({"off": _run(2, weights), "on": _run(0, weights + 2**21, output="other")})
    assert (code, verdict) == (1, "the forward after the reload differs from the run that kept its caches")
    none = _run(0, weights)
    none["caches"] = none["left"] = {"entries": 0, "bytes": 0}
    assert judge({"off": none, "on": none})[:2] == (1, "TE made no FP8 caches here: nothing to hand back")
    code, verdict, figures = judge({"off": _run(2, None), "on": _run(0, None)})
    assert code == 0 and "not measured" in verdict and figures["share"] is None


def test_the_device_demo_runs_the_selftest_first_and_stops_where_it_cannot_run() -> None:
    """scripts/device-demo.sh (what the project runs where a GPU machine is lent) starts with the
    selftest; on a GPU machine without TE (the twin's GPU answers alone, as that machine's image
    gives) it exits 2 saying "no TE", and runs no demo."""
    env = child_env({"TE_TWIN_SITE": "device", "PYTHON": sys.executable}, path=[SITE])
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "device-demo.sh")], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "te-offload-shim selftest: cannot run here: no TE: transformer_engine.pytorch does not import here "
        "(ModuleNotFoundError: No module named 'transformer_engine')"
    ]
    assert "device-demo:" not in proc.stdout, "the demo did not run"
