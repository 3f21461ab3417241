"""What `TE_OFFLOAD_SHIM_TE_GLOBALS=1` gives back, counted on the TE twin (harness/te_twin).

TE's own modules (a LayerNormLinear 128 -> 128, a Linear 128 -> 256, a LayerNormMLP 256 and a
GroupedLinear 256 -> 128, float32)
with Megatron's wgrad fusion (`fuse_wgrad_accumulation`, a `main_grad` per weight) train one step under
FP8 delayed scaling; TE's backward fills its process-global `_dummy_wgrads`. Then the offload point,
side by side: keep them (the reference) or give them back (te/process_globals.py, what the wrapped
offload runs after its clearing). Printed per release: the tensors and bytes TE holds there, what was
given back, the cuBLAS workspaces left in place (never given back: docs/residue.md), and whether the
next step's outputs and `main_grad`s are bit-identical. Counts on the twin, not a GPU's figures: what
the driver sees released is a device run's.

    .venv/bin/python benchmarks/twin_te_globals.py [--releases 2.20.2,2.16.1,2.9.0,2.4.0]
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
RELEASES = ("2.20.2", "2.16.1", "2.9.0", "2.4.0")
MODULES = ("LayerNormLinear", "Linear", "LayerNormMLP", "GroupedLinear")


def _stack(seed: int) -> list[Any]:
    import torch

    from harness.te_twin import training

    torch.manual_seed(seed)
    te = training.te()
    layers = [
        te.LayerNormLinear(training.HIDDEN, training.OUT, params_dtype=torch.float32, fuse_wgrad_accumulation=True),
        te.Linear(training.OUT, training.FFN, params_dtype=torch.float32, fuse_wgrad_accumulation=True),
        te.LayerNormMLP(training.FFN, training.FFN, params_dtype=torch.float32, fuse_wgrad_accumulation=True),
        te.GroupedLinear(
            training.GROUPS, training.FFN, training.OUT, params_dtype=torch.float32, fuse_wgrad_accumulation=True
        ),
    ]
    for layer in layers:
        for p in layer.parameters():
            p.main_grad = torch.zeros_like(p)
            p.grad_added_to_main_grad = False
    return layers


def _step(layers: list[Any], step: int) -> Any:
    from harness import te_twin
    from harness.te_twin import training

    x = training.batch(step, 0)
    with te_twin.autocast(training.make_recipe("DelayedScaling")):
        for layer in layers:
            if type(layer).__name__ == "GroupedLinear":
                x = layer(x, [training.TOKENS // training.GROUPS] * training.GROUPS, is_first_microbatch=True)
            else:
                x = layer(x, is_first_microbatch=True)
                x = x[0] if isinstance(x, tuple) else x
    x.float().square().mean().backward()
    for layer in layers:
        for p in layer.parameters():
            p.grad = None  # Megatron's DDP hook, once the gradient is in main_grad
            p.grad_added_to_main_grad = False
    return x.detach()


def child(release: str) -> dict[str, Any]:
    import torch

    from harness import te_twin
    from te_offload_shim.reports.process_memory import te_global_memory
    from te_offload_shim.te import process_globals
    from te_offload_shim.te.report import CacheReport

    te_twin.load(release)
    base = sys.modules["transformer_engine.pytorch.module.base"]
    if "_dummy_wgrads" not in vars(base):
        return {"release": release, "absent": True}
    kept, given = _stack(0), _stack(0)
    _step(kept, 0)
    _step(given, 0)
    held = dict(base._dummy_wgrads)
    found = te_global_memory(torch, "cpu")  # the twin's "cuda" tensors live on the CPU
    del held
    back = process_globals.give_back(CacheReport()) or process_globals.GivenBack()
    same = True
    for step in (1, 2):
        same &= torch.equal(_step(kept, step), _step(given, step))
        same &= all(
            torch.equal(a.main_grad, b.main_grad)
            for ka, kb in zip(kept, given, strict=True)
            for a, b in zip(ka.parameters(), kb.parameters(), strict=True)
        )
    return {
        "release": release,
        "dummy_bytes": found.get("_dummy_wgrads"),
        "given_entries": back.entries,
        "given_bytes": back.bytes,
        "cublas_bytes": found.get("cublas_workspaces"),
        "rebuilt": len(base._dummy_wgrads),
        "identical": bool(same),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", default=",".join(RELEASES), help="TE releases, comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT + json.dumps(child(args.child)), flush=True)
        return
    env = {**os.environ, "PYTHONPATH": str(REPO), "NVTE_TORCH_COMPILE": "0"}
    rows = []
    for release in args.releases.split(","):
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", __file__, "--child", release],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
        )  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
        if not lines:
            sys.exit(f"TE {release}: no result ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows.append(json.loads(lines[-1][len(RESULT) :]))
    print(f"{'TE':>8}  {'_dummy_wgrads kept':>18}  {'given back':>18}  {'cuBLAS left':>12}  {'next steps':>14}")
    for r in rows:
        if r.get("absent"):
            print(f"{r['release']:>8}  {'(none in this release)':>18}")
            continue
        kept = f"{r['dummy_bytes'] / 1024:.0f} KiB"
        given = f"{r['given_entries']} = {r['given_bytes'] / 1024:.0f} KiB"
        cublas = "-" if r["cublas_bytes"] is None else f"{r['cublas_bytes'] / 2**20:.2f} MiB"
        same = "bit-identical" if r["identical"] else "DIFFERENT"
        print(f"{r['release']:>8}  {kept:>18}  {given:>18}  {cublas:>12}  {same:>14}")


if __name__ == "__main__":
    main()
