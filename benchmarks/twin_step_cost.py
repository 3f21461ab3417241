"""What a clear costs the next training step, counted on the TE twin (harness/te_twin).

TE's own modules (a LayerNormLinear, a Linear, a LayerNormMLP and a GroupedLinear in a row,
hidden 128) train one step (2 microbatches, is_first_microbatch True then False) inside FP8
autocast; then the offload point: either nothing (the caches stay) or the shim's clear
(`clear_fp8_workspaces`, what the wrapped offload runs); then the next step is counted: every call
TE makes into its extension (quantize, fp8_transpose, generic_gemm, ...) and every device
allocation (bytes and count; harness/te_twin/counters.py says what is counted). Per recipe, in a
fresh interpreter per release and GPU architecture (MXFP8 on a faked sm100). Also the step's CPU
time on the twin, median of the repeats, keep and clear alternated: a twin figure, not a GPU one.

    .venv/bin/python benchmarks/twin_step_cost.py [--quick] [--releases 2.20.2,2.9.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = "RESULT "
RECIPES = {90: ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"), 100: ("MXFP8BlockScaling",)}
SHOWN = ("quantize", "fp8_transpose", "generic_gemm", "te_general_grouped_gemm", "layernorm_fwd", "split_quantize")


def _model() -> Any:
    import torch

    from harness.te_twin import training

    layers = [
        training.build(name, seed)
        for seed, name in enumerate(("LayerNormLinear", "Linear", "LayerNormMLP", "GroupedLinear"))
    ]
    return torch.nn.ModuleList(layers)


def _measure(recipe: str, clear: bool) -> dict[str, Any]:
    """One model: a warm-up step, the offload point, the counted step."""
    from harness.te_twin import counters, training
    from te_offload_shim.te.caches import clear_fp8_workspaces

    model = _model()
    training.train(model, recipe, steps=1)
    report = clear_fp8_workspaces(model, strict=True) if clear else None
    start = time.process_time()
    with counters.counting():
        training.train(model, recipe, steps=1)
        calls = dict(counters.calls)
        allocated, allocations = counters.allocated_bytes, counters.allocations
    elapsed = time.process_time() - start
    return {
        "calls": calls,
        "bytes": allocated,
        "allocations": allocations,
        "seconds": elapsed,
        "cleared_entries": report.entries if report else 0,
        "cleared_bytes": report.bytes if report else 0,
        "cache_bytes_after": sum(
            training.unique_storage_bytes(training.inner_tensors(v)) for v in training.workspaces(model).values()
        ),
    }


def child(release: str, sm: int, repeats: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(REPO))
    from harness import te_twin
    from harness.te_twin import training

    te_twin.load(release, sm=sm)
    out: dict[str, Any] = {}
    for recipe in RECIPES[sm]:
        if training.recipe_class(recipe) is None:
            out[recipe] = {"absent": f"TE {release} has no {recipe}"}
            continue
        runs: dict[str, list[dict[str, Any]]] = {"keep": [], "clear": []}
        for i in range(repeats):
            for case in ("keep", "clear") if i % 2 == 0 else ("clear", "keep"):
                runs[case].append(_measure(recipe, case == "clear"))
        out[recipe] = {
            case: {**results[0], "seconds": statistics.median(r["seconds"] for r in results)}
            for case, results in runs.items()
        }
        for results in runs.values():  # the counts are deterministic: every repeat the same
            assert all(r["calls"] == results[0]["calls"] and r["bytes"] == results[0]["bytes"] for r in results)
    print(RESULT + json.dumps({"release": release, "sm": sm, "recipes": out}), flush=True)


def _run_child(release: str, sm: int, repeats: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "NVTE_"))}
    env["PYTHONPATH"] = str(REPO)
    args = [sys.executable, "-W", "ignore", __file__, "--child", release, str(sm), "--repeats", str(repeats)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise SystemExit(f"twin_step_cost child {release} sm{sm} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| TE | recipe | after the offload | "
        + " | ".join(SHOWN)
        + " | other calls | device bytes | allocations | step CPU s |",
        "|---|---|---|" + "---|" * len(SHOWN) + "---|---|---|---|",
    ]
    for result in results:
        for recipe, data in result["recipes"].items():
            if "absent" in data:
                lines.append(f"| {result['release']} | {recipe} | {data['absent']} |" + " |" * (len(SHOWN) + 4))
                continue
            for case, label in (("keep", "caches kept"), ("clear", "caches cleared")):
                d = data[case]
                other = sum(n for k, n in d["calls"].items() if k not in SHOWN)
                counts = " | ".join(str(d["calls"].get(k, 0)) for k in SHOWN)
                lines.append(
                    f"| {result['release']} | {recipe} | {label} | {counts} | {other} | {d['bytes']:,} | "
                    f"{d['allocations']} | {d['seconds']:.3f} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("RELEASE", "SM"))
    parser.add_argument("--releases", default="2.20.2,2.9.0")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one release, one repeat: checks that it runs")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.repeats)
        return 0
    releases = args.releases.split(",")[:1] if args.quick else args.releases.split(",")
    repeats = 1 if args.quick else args.repeats
    results = [_run_child(r, sm, repeats) for r in releases for sm in RECIPES]
    for line in _table(results):
        print(line)
    print()
    for result in results:
        for recipe, data in result["recipes"].items():
            if "absent" in data:
                continue
            keep, clear = data["keep"], data["clear"]
            same = keep["calls"] == clear["calls"]
            extra = clear["bytes"] - keep["bytes"]
            print(
                f"TE {result['release']} {recipe}: same kernel calls with and without the clear: {same}; "
                f"the clear freed {clear['cleared_entries']} entries, {clear['cleared_bytes']:,} B; the next step "
                f"allocated {extra:+,} B more ({clear['allocations'] - keep['allocations']:+} allocations), "
                f"caches after it {clear['cache_bytes_after']:,} B (kept: {keep['cache_bytes_after']:,} B); "
                f"step CPU time ratio clear/keep {clear['seconds'] / keep['seconds']:.3f}"
            )
    print(RESULT + json.dumps({"results": results, "quick": args.quick}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
