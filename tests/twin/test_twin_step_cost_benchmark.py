"""benchmarks/twin_step_cost.py runs and measures what it claims (its --quick form; no timing is
asserted): the step after a clear makes the same kernel calls as the step after keeping the
caches, and allocates exactly the bytes the clear freed (TE rebuilds the caches), per recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_step_cost_benchmark_quick_run_same_kernels_and_the_cleared_bytes_reallocated() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "NVTE_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(REPO / "benchmarks" / "twin_step_cost.py"), "--quick"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    results = json.loads(lines[-1][len("RESULT ") :])["results"]
    recipes = {recipe: data for result in results for recipe, data in result["recipes"].items()}
    assert set(recipes) == {"DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling"}
    for recipe, data in recipes.items():
        keep, clear = data["keep"], data["clear"]
        assert keep["calls"] == clear["calls"] and keep["calls"]["generic_gemm"] > 0, recipe
        assert clear["cleared_entries"] > 0 and keep["cleared_entries"] == 0, recipe
        assert clear["bytes"] - keep["bytes"] == clear["cleared_bytes"] > 0, recipe
        assert clear["cache_bytes_after"] == keep["cache_bytes_after"] == clear["cleared_bytes"], recipe
