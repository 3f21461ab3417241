"""Shared plumbing for the benchmarks: paths, medians, A/B timing, result rows, the table.

Every figure is a median over repeated runs, measured side by side with its reference in the same
process and the same run, the two alternated so drift (frequency scaling, a noisy neighbour) hits
both alike. The garbage collector is collected before and disabled during each timed call, so a
collection triggered by one side is not billed to the other (one measurement leaves it on: what the
collector costs a call, `ab(..., collector=True)`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
RESULT_PREFIX = "RESULT "
WIDTH = 120  # the widest line a printed table may have; longer notes wrap under their column
QUICK_NOTE = "--quick: tiny configurations, few repeats: these figures only show that it runs; do not quote them"


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


# The generation collected before each timed call: all of them (2) for figures, only the young (1)
# under --quick, whose figures are never quoted: a full collection of a heap holding verl,
# transformers and ray takes about 0.3 s here, most of a quick run's time.
PRE_COLLECT = 2


def timed(fn: Callable[[], Any], collector: bool = False) -> tuple[float, Any]:
    """Seconds one call of `fn` takes, and its result; gc collected before, disabled during (left
    on with `collector`, to measure what the collector costs a call)."""
    gc.collect(PRE_COLLECT)
    if collector:
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result
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
    collector: bool = False,
) -> dict[str, Any]:
    """Alternate `ours` and `reference` `repeats` times each (order flipped every round).

    `prepare` runs before every timed call, untimed (refill what the previous call consumed);
    `check(side, result)` runs after it, untimed (both sides must have done the same work);
    `collector`: the garbage collector stays on during the timed calls."""
    samples: dict[str, list[float]] = {"ours": [], "reference": []}
    sides = {"ours": ours, "reference": reference}
    for i in range(repeats):
        for side in ("ours", "reference") if i % 2 == 0 else ("reference", "ours"):
            if prepare is not None:
                prepare()
            seconds, result = timed(sides[side], collector)
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


def description(doc: str) -> str:
    """The first paragraph of a script's docstring, whole, for --help (argparse rewraps it)."""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, `prog: error: ... (see --help)`, exit status 2."""

    def __init__(self, doc: str, **kwargs: Any) -> None:
        super().__init__(description=description(doc), **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def output_file(text: str) -> Path:
    """An argparse type: a file path to write, whose folder exists or can be made (made here)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot create the folder of {text}: {exc.strerror or exc}") from None
    return path


def main(run: Callable[[bool], dict[str, Any]], doc: str, quick_help: str, argv: list[str] | None = None) -> None:
    """The command line every table benchmark shares: `--quick`, print the table, emit the result."""
    parser = Parser(doc)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    quick = parser.parse_args(argv).quick
    global PRE_COLLECT
    PRE_COLLECT = 1 if quick else 2
    result = run(quick)
    if quick:
        print(QUICK_NOTE)
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


def table(rows: list[dict[str, Any]], markdown: bool = False, width: int = WIDTH) -> str:
    """The rows side by side: ours, reference, ratio (ours / reference), note.

    Plain text keeps every line within `width`: a long case or note wraps onto continuation lines
    under its own column (Markdown rows stay one line each: a renderer wraps them)."""
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
    widths[1] = min(widths[1], 36)  # a long case wraps rather than squeezing the note
    # the note takes what is left of the line (2 spaces between columns), at least 24 characters
    widths[-1] = max(24, width - sum(widths[:-1]) - 2 * (len(head) - 1))
    out = [_line(head, widths), _line(["-" * w for w in widths], widths)]
    for c in cells:
        wrapped = [textwrap.wrap(text, w, break_on_hyphens=False) or [""] for text, w in zip(c, widths, strict=True)]
        for i in range(max(len(parts) for parts in wrapped)):
            out.append(_line([parts[i] if i < len(parts) else "" for parts in wrapped], widths))
    return "\n".join(out)


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()


def quiet_env() -> dict[str, str]:
    """The environment for a benchmark subprocess: no shim switches inherited from the caller."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
