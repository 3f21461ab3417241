"""Interpreter start-up cost of the shim, judged as a user feels it: `import te_offload_shim` within
GOAL_MS (its -X importtime, cumulative), and an interpreter start (`python -c pass`) with the .pth
within GOAL_RATIO of one without it; nothing beyond the standard library imported at start-up.

Two throw-away venvs that differ only in `te_offload_shim.pth` (both see this checkout through a
path .pth, as an editable install does). Runs alternate between the two set-ups, so that machine
load drifts over both alike; medians of --runs each.

    .venv/bin/python benchmarks/startup.py [--runs 40]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from te_offload_shim.activation import pth  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Parser, emit, positive_int  # noqa: E402

GOAL_MS = 1.0
GOAL_RATIO = 1.03  # a start with the .pth, against one without, in a training environment
STACK_OFF = "training env: python -c pass (no .pth)"
STACK_ON = "training env: python -c pass (.pth)"
IMPORTTIME_RUNS = 20
EMPTY = "empty_package_for_scale"


def make_venv(root: Path, *, shim_pth: bool, floor_pth: bool = False, stack: str = "") -> Path:
    """A throw-away venv seeing this checkout; `stack`: a site-packages folder processed at start too
    (its own .pth files run), as a training image's is."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The checkout, then a folder holding an empty package: the floor any package's import pays here
    Path(site, "checkout.pth").write_text(f"{REPO}\n{root / 'floor'}\n")
    if stack:  # first in name order, so the stack's own .pth files run before ours, as in an image
        Path(site, "000-stack.pth").write_text(f"import site; site.addsitedir({stack!r})\n")
    Path(root, "floor", EMPTY).mkdir(parents=True)
    Path(root, "floor", EMPTY, "__init__.py").write_text("")
    if shim_pth:
        pth.enable(site)
    if floor_pth:  # the same floor for the .pth route: an empty package imported by a .pth line
        Path(site, "floor.pth").write_text(f"import {EMPTY}\n")
    return python


def wall_ms(cmd: list[str | Path], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    return (time.perf_counter() - start) * 1e3


def importtime_us(python: Path, env: dict[str, str], package: str = "te_offload_shim") -> int:
    """Cumulative -X importtime of `package`, however it got imported (.pth or statement)."""
    err = subprocess.run(
        [python, "-X", "importtime", "-c", f"import {package}"], env=env, capture_output=True, text=True
    ).stderr
    match = re.search(rf"^import time:\s+\d+ \|\s+(\d+) \|\s+{package}$", err, re.M)
    return int(match.group(1)) if match else -1


def modules(python: Path, env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        [python, "-c", "import sys; print('\\n'.join(sys.modules))"], env=env, capture_output=True, text=True
    )
    return set(out.stdout.split())


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--runs", type=positive_int, default=40, help="interpreter starts per case (default 40)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    with tempfile.TemporaryDirectory() as tmp:
        off = make_venv(Path(tmp, "off"), shim_pth=False)
        on = make_venv(Path(tmp, "on"), shim_pth=True)
        floor_on = make_venv(Path(tmp, "floor_on"), shim_pth=False, floor_pth=True)
        stack = sysconfig.get_paths()["purelib"]  # this project's .venv: torch, megatron-core, ray, verl's deps
        stack_off = make_venv(Path(tmp, "stack_off"), shim_pth=False, stack=stack)
        stack_on = make_venv(Path(tmp, "stack_on"), shim_pth=True, stack=stack)
        cases: dict[str, list[str | Path]] = {
            "python -c pass (no .pth)": [off, "-c", "pass"],
            "python -c pass (.pth enabled)": [on, "-c", "pass"],
            "python -c 'import te_offload_shim'": [off, "-c", "import te_offload_shim"],
            STACK_OFF: [stack_off, "-c", "pass"],
            STACK_ON: [stack_on, "-c", "pass"],
        }
        for cmd in cases.values():  # warm the file cache and write the .pyc files
            wall_ms(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, cmd in cases.items():
                times[name].append(wall_ms(cmd, env))
        med = {name: statistics.median(values) for name, values in times.items()}
        # -X importtime's cumulative figure for the package: as a statement, and run by the .pth
        imp = statistics.median(importtime_us(off, env) for _ in range(IMPORTTIME_RUNS))
        imp_pth = statistics.median(importtime_us(on, env) for _ in range(IMPORTTIME_RUNS))
        floor = statistics.median(importtime_us(off, env, EMPTY) for _ in range(IMPORTTIME_RUNS))
        floor_pth = statistics.median(importtime_us(floor_on, env, EMPTY) for _ in range(IMPORTTIME_RUNS))
        added = sorted(modules(on, env) - modules(off, env))

    base = med["python -c pass (no .pth)"]
    runs = times["python -c pass (no .pth)"]
    quartiles = statistics.quantiles(runs, n=4) if len(runs) > 1 else [0.0, 0.0, 0.0]
    print(f"python {sys.version.split()[0]}, {args.runs} interleaved runs each, medians (ms)")
    print(f"{'case':<38} {'median':>8} {'added':>8}")
    for name, value in med.items():
        reference = med[STACK_OFF] if name == STACK_ON else base
        extra = "" if name in (STACK_OFF, "python -c pass (no .pth)") else f"{value - reference:+8.2f}"
        print(f"{name:<38} {value:8.2f} {extra}")
    print(
        f"(wall clock of whole interpreter runs: their spread, {quartiles[2] - quartiles[0]:.2f} ms between the "
        "quartiles of `python -c pass`, is larger than the cost measured; -X importtime below is the figure)"
    )
    print(f"-X importtime of te_offload_shim, cumulative, median of {IMPORTTIME_RUNS}:")
    print(f"  import te_offload_shim          {imp / 1e3:.2f} ms   (goal < {GOAL_MS} ms)")
    print(f"  an empty package, for scale     {floor / 1e3:.2f} ms   (finding and loading any package here)")
    print(f"  run by the .pth at start-up     {imp_pth / 1e3:.2f} ms")
    print(f"  an empty package by a .pth      {floor_pth / 1e3:.2f} ms   (the same floor at start-up)")
    foreign = [m for m in added if m != "te_offload_shim" and not m.startswith("te_offload_shim.")]
    print(f"modules added at start-up by the .pth: {', '.join(added)}")
    print(f"of which outside te_offload_shim: {', '.join(foreign) or 'none'}")
    with_pth, imported = med["python -c pass (.pth enabled)"], med["python -c 'import te_offload_shim'"]
    print("the goals:")
    met = "met" if imp / 1e3 <= GOAL_MS else "NOT met"
    print(f"  import te_offload_shim <= {GOAL_MS} ms: {imp / 1e3:.2f} ms ({met})")
    ratio = med[STACK_ON] / med[STACK_OFF]
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(
        f"  a start with the .pth within {GOAL_RATIO - 1:.0%} of one without, in a training environment: "
        f"{ratio - 1:+.1%} ({verdict}; in a bare venv: {with_pth / base - 1:+.1%} of {base:.1f} ms)"
    )
    common = {"benchmark": "start-up", "unit": "ms", "reference": base, "repeats": args.runs}
    emit(
        {
            "benchmark": "startup",
            "rows": [
                {
                    **common,
                    "case": "interpreter start, .pth active",
                    "ours": with_pth,
                    "ratio": with_pth / base,
                    "note": f"python -c pass with the shim's .pth vs without; added {with_pth - base:+.2f} ms",
                },
                {
                    **common,
                    "case": "interpreter start in a training environment, .pth active",
                    "ours": med[STACK_ON],
                    "reference": med[STACK_OFF],
                    "ratio": ratio,
                    "note": "python -c pass, this project's .venv site-packages processed at start, with the "
                    f"shim's .pth vs without; added {med[STACK_ON] - med[STACK_OFF]:+.2f} ms",
                },
                {
                    **common,
                    "case": "import te_offload_shim",
                    "ours": imported,
                    "ratio": imported / base,
                    "note": f"python -c 'import te_offload_shim' vs python -c pass; added {imported - base:+.2f} ms; "
                    f"-X importtime {imp / 1e3:.2f} ms (an empty package {floor / 1e3:.2f} ms; by the .pth "
                    f"{imp_pth / 1e3:.2f} ms, an empty package by a .pth {floor_pth / 1e3:.2f} ms); "
                    f"modules outside the package: {', '.join(foreign) or 'none'}",
                },
            ],
            "modules_added": added,
        }
    )


if __name__ == "__main__":
    main()
