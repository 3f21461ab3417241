"""Shared plumbing for the benchmarks: paths, medians, A/B timing, result rows, the table.

Every figure is a median over repeated runs, measured side by side with its reference in the same
process and the same run, the two alternated so drift (frequency scaling, a noisy neighbour) hits
both alike. The garbage collector is collected before and disabled during each timed call, so a
collection triggered by one side is not billed to the other.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
RESULT_PREFIX = "RESULT "


def use_repo(verl: str | None = None) -> None:
    """Put the repository (harness/, te_offload_shim/) and optionally one verl release on sys.path."""
    paths = [str(REPO)]
    if verl is not None:
        folder = DEPS / f"verl-{verl}"
        if not (folder / "verl").is_dir():
            raise SystemExit(f"verl {verl} is not in {folder}: run scripts/setup-env.sh")
        paths.append(str(folder))
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds one call of `fn` takes, and its result; gc collected before, disabled during."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return elapsed, result


def ab(
    ours: Callable[[], Any],
    reference: Callable[[], Any],
    repeats: int,
    prepare: Callable[[], None] | None = None,
    check: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Alternate `ours` and `reference` `repeats` times each (order flipped every round).

    `prepare` runs before every timed call, untimed (refill what the previous call consumed);
    `check(side, result)` runs after it, untimed (both sides must have done the same work)."""
    samples: dict[str, list[float]] = {"ours": [], "reference": []}
    sides = {"ours": ours, "reference": reference}
    for i in range(repeats):
        for side in ("ours", "reference") if i % 2 == 0 else ("reference", "ours"):
            if prepare is not None:
                prepare()
            seconds, result = timed(sides[side])
            if check is not None:
                check(side, result)
            samples[side].append(seconds)
    return summary(samples["ours"], samples["reference"])


def summary(ours: list[float], reference: list[float]) -> dict[str, Any]:
    o, r = statistics.median(ours), statistics.median(reference)
    return {
        "ours_s": o,
        "reference_s": r,
        "ratio": o / r if r > 0 else None,
        "repeats": len(ours),
        "ours_samples_s": ours,
        "reference_samples_s": reference,
    }


def row(benchmark: str, case: str, figures: dict[str, Any], unit: str = "ms", **extra: Any) -> dict[str, Any]:
    """One line of the table: our median, the reference's, and ours/reference."""
    scale = {"ms": 1e3, "s": 1.0, "us": 1e6}[unit]
    out = {
        "benchmark": benchmark,
        "case": case,
        "unit": unit,
        "ours": figures["ours_s"] * scale,
        "reference": figures["reference_s"] * scale,
        "ratio": figures["ratio"],
        "repeats": figures["repeats"],
    }
    out.update(extra)
    return out


def main(run: Callable[[bool], dict[str, Any]], doc: str, quick_help: str, argv: list[str] | None = None) -> None:
    """The command line every table benchmark shares: `--quick`, print the table, emit the result."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    result = run(parser.parse_args(argv).quick)
    print(table(result["rows"]))
    emit(result)


def emit(result: dict[str, Any]) -> None:
    """The machine-readable line run.py reads from a benchmark's stdout."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any] | None:
    lines = [line[len(RESULT_PREFIX) :] for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1]) if lines else None


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The rows side by side: ours, reference, ratio (ours / reference), note."""
    head = ["benchmark", "case", "ours", "reference", "unit", "ratio", "note"]
    cells = [
        [
            r.get("benchmark", ""),
            r.get("case", ""),
            _fmt(r.get("ours")),
            _fmt(r.get("reference")),
            r.get("unit", ""),
            _fmt(r.get("ratio")),
            r.get("note", ""),
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*c) for c in cells)])


def quiet_env() -> dict[str, str]:
    """The environment for a benchmark subprocess: no shim switches inherited from the caller."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
