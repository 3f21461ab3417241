"""How much a clear between microbatches changes training, measured on the TE twin (harness/te_twin).

Per release, recipe and module: TE's own module trained 3 steps x 2 microbatches
(is_first_microbatch True then False, float32, seeded; harness/te_twin/training.py), three ways:
caches kept; the shim's clear before every second microbatch (an offload mid-step); and caching
off for that microbatch (`is_first_microbatch=None`). Prints the largest loss and weight
differences of the mid-step clear against keeping, and whether it equals the uncached run to the
bit. Each release runs in a fresh interpreter (MXFP8 on a faked sm100).

    .venv/bin/python benchmarks/twin_mid_step.py [--releases 2.20.2,2.9.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = "RESULT "
RECIPES = {90: ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"), 100: ("MXFP8BlockScaling",)}


def child(release: str, sm: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(REPO))
    from harness import te_twin
    from harness.te_twin import training
    from te_offload_shim.te.caches import clear_fp8_workspaces

    te_twin.load(release, sm=sm)

    def mid_clear(model: Any, step: int, microbatch: int) -> None:
        if microbatch == 1:
            clear_fp8_workspaces(model, strict=True)

    rows: list[dict[str, Any]] = []
    for recipe in RECIPES[sm]:
        if training.recipe_class(recipe) is None:
            continue
        for module in training.MODULES:
            try:
                keep = training.train(training.build(module), recipe)
            except NotImplementedError as exc:  # TE's own refusal (2.1 GroupedLinear + MXFP8)
                rows.append({"recipe": recipe, "module": module, "refused": str(exc)})
                continue
            mid = training.train(training.build(module), recipe, before_microbatch=mid_clear)
            uncached = training.train(
                training.build(module), recipe, first_microbatch=lambda step, mb: True if mb == 0 else None
            )
            loss_scale = max(float(x.abs()) for x in keep.losses)
            rows.append(
                {
                    "recipe": recipe,
                    "module": module,
                    "loss_diff": mid.max_loss_diff(keep),
                    "loss_rel": mid.max_loss_diff(keep) / loss_scale,
                    "weight_diff": mid.max_weight_diff(keep),
                    "same_as_keep": mid.same(keep),
                    "same_as_uncached": mid.same(uncached),
                }
            )
    print(RESULT + json.dumps({"release": release, "rows": rows}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("RELEASE", "SM"))
    parser.add_argument("--releases", default="2.20.2,2.9.0")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "NVTE_"))}
    env["PYTHONPATH"] = str(REPO)
    print("| TE | recipe | module | max abs loss diff | relative | max abs weight diff | = keep | = uncached mb |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for release in args.releases.split(","):
        for sm in RECIPES:
            cmd = [sys.executable, "-W", "ignore", __file__, "--child", release, str(sm)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
            lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
            if not lines:
                raise SystemExit(f"twin_mid_step child {release} sm{sm} failed:\n{proc.stderr[-4000:]}")
            result = json.loads(lines[-1][len(RESULT) :])
            results.append(result)
            for r in result["rows"]:
                if "refused" in r:
                    print(f"| {release} | {r['recipe']} | {r['module']} | TE refuses: {r['refused']} | | | | |")
                    continue
                print(
                    f"| {release} | {r['recipe']} | {r['module']} | {r['loss_diff']:.3g} | {r['loss_rel']:.2g} | "
                    f"{r['weight_diff']:.3g} | {'yes' if r['same_as_keep'] else 'no'} | "
                    f"{'yes' if r['same_as_uncached'] else 'no'} |"
                )
    print(RESULT + json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
