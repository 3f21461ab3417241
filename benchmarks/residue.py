"""Cost of `TE_OFFLOAD_SHIM_AUDIT=1`: the residue report after an offload, against the shim's own
clearing at the same offload (`te_caches.clear_fp8_workspaces`, with its byte accounting).

The tree is walk.py's: MoE-like, named like megatron-core's GPT layers, TE modules as stand-ins,
about 0.95 cache entries per module, tiny tensors (the walk and the bookkeeping are measured, not
memory traffic). Two cases, each alternated with the reference in the same run:

* after the shim's offload: the caches cleared, nothing on a device (on a CPU machine every tensor
  is on the host, as after a full offload). Ours is exactly what the wrapper runs when the switch
  is on: `audit.begin(...)` before the original, `.finish()` after it (walk, report, log line).
  The reference clears a tree whose caches are refilled before every call, untimed.
* worst case: every tensor counted (`device_type="cpu"`), caches filled: a model nothing was
  offloaded from.

    .venv/bin/python benchmarks/residue.py [--quick]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import main, row, summary, timed
from walk import build_tree


def _alternate(ours: Any, reference: Any, repeats: int, prepare: dict[str, Any]) -> dict[str, Any]:
    """Like `_common.ab`, with a different untimed preparation per side."""
    samples: dict[str, list[float]] = {"ours": [], "reference": []}
    sides = {"ours": ours, "reference": reference}
    for i in range(repeats):
        for side in ("ours", "reference") if i % 2 == 0 else ("reference", "ours"):
            prepare[side]()
            seconds, _ = timed(sides[side])
            samples[side].append(seconds)
    return summary(samples["ours"], samples["reference"])


def measure(modules: int, repeats: int) -> dict[str, Any]:
    os.environ["TE_OFFLOAD_SHIM_AUDIT"] = "1"
    from te_offload_shim.engine import stats
    from te_offload_shim.integrations.targets import Target
    from te_offload_shim.reports import audit as audit
    from te_offload_shim.reports.residue import residue
    from te_offload_shim.te.caches import clear_fp8_workspaces

    root, refills = build_tree(modules)
    target = Target("benchmark", "benchmarks.residue", "offload")

    def refill() -> None:
        for ws, entries in refills:
            ws.update(entries)

    def empty() -> None:
        for ws, _ in refills:
            ws.clear()

    def audit_offload() -> None:
        pending = audit.begin(target, [root])
        if pending is None:
            raise AssertionError("the audit did not start")
        pending.finish(stats.count_audit)  # as the wrapped offload hands it the engine's counter

    after = _alternate(
        audit_offload, lambda: clear_fp8_workspaces([root]), repeats, {"ours": empty, "reference": refill}
    )
    worst = _alternate(
        lambda: residue([root], device_type="cpu"),
        lambda: clear_fp8_workspaces([root]),
        repeats,
        {"ours": refill, "reference": refill},
    )
    empty()
    latest = stats.counts()["audit"] or {}
    refill()
    full = residue([root], device_type="cpu")
    return {
        "modules": sum(1 for _ in root.modules()),
        "entries": sum(len(e) for _, e in refills),
        "after_offload": after,
        "worst": worst,
        "after_offload_total_bytes": latest.get("total_bytes"),
        "worst_storages": full.storages,
        "worst_by_category": full.by_category,
    }


SIZES = {"full": ((100_000, 5),), "quick": ((500, 3),)}


def run(quick: bool = False) -> dict[str, Any]:
    rows, cases = [], []
    for modules, repeats in SIZES["quick" if quick else "full"]:
        m = measure(modules, repeats)
        cases.append(m)
        size = f"{m['modules']:,} modules"
        rows.append(
            row(
                "residue audit",
                f"{size}: after the shim's offload",
                m["after_offload"],
                note="audit.begin+finish (walk, report, log line), nothing on a device, caches cleared "
                f"vs the shim's clearing of {m['entries']:,} entries at the same offload",
            )
        )
        rows.append(
            row(
                "residue audit",
                f"{size}: everything resident",
                m["worst"],
                note=f"residue(device_type='cpu'): {m['worst_storages']:,} storages counted, caches filled "
                "vs the same clearing",
            )
        )
    return {"benchmark": "residue", "quick": quick, "rows": rows, "cases": cases}


if __name__ == "__main__":
    main(run, __doc__, "a tiny tree, few repeats (tests)")
