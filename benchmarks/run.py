"""Every benchmark, one table: each figure a median over repeated runs, side by side with the
reference it is compared against (measured in the same run), and the ratio ours / reference.

    benchmarks/run.sh [--quick] [--only walk,net,offload,residue,startup,gpu] [--json PATH]

Each benchmark runs in a fresh interpreter of its own (they put different verl releases on the
path, and start-up must be measured from a clean process). The table is printed and written as
JSON to benchmarks/results/latest.json (git-ignored; BENCHMARKS.md carries the published table).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUICK_NOTE, REPO, Parser, output_file, parse_result, quiet_env, table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"
SCRIPTS = {"walk": "walk.py", "net": "net.py", "offload": "offload_overhead.py", "residue": "residue.py"}
ORDER = ("startup", "walk", "net", "offload", "residue", "gpu")


def _script(name: str, extra: list[str], timeout: int = 900) -> dict[str, Any]:
    env = quiet_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / name), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    result = parse_result(proc.stdout)
    if result is None:
        raise RuntimeError(f"{name} exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}")
    return result


def _not_available(benchmark: str, why: str) -> dict[str, Any]:
    return {"rows": [{"benchmark": benchmark, "case": "not available", "note": why}]}


def startup(quick: bool) -> dict[str, Any]:
    return _script("startup.py", ["--runs", "5"] if quick else [])


def gpu(quick: bool) -> dict[str, Any]:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        return _not_available("gpu memory", "no CUDA device here: run benchmarks/gpu_memory.py on one")
    result = _script("gpu_memory.py", [])
    rows = []
    for name in ("without", "with"):
        c = result["cases"][name]
        freed = c["after"]["free"] - c["before"]["free"]
        rows.append(
            {
                "benchmark": "gpu memory",
                "case": f"{name} shim",
                "unit": "MiB",
                "ours": c["after"]["allocated"] / 2**20,
                "reference": c["caches_before"]["bytes"] / 2**20,
                "ratio": None,
                "note": f"allocated after offload vs cache size; driver got back {freed / 2**20:,.0f} MiB"
                f"; entries left {c['caches_after']['entries']}",
            }
        )
    return {**result, "rows": rows}


def run_all(quick: bool, only: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in ORDER:
        if name not in only:
            continue
        start = time.perf_counter()
        try:
            if name == "startup":
                results[name] = startup(quick)
            elif name == "gpu":
                results[name] = gpu(quick)
            else:
                results[name] = _script(SCRIPTS[name], ["--quick"] if quick else [])
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            results[name] = _not_available(name, f"failed: {type(exc).__name__}: {str(exc)[:300]}")
            results[name]["error"] = True
        results[name]["seconds"] = time.perf_counter() - start
    rows = [r for name in ORDER if name in results for r in results[name].get("rows", [])]
    return {"machine": machine(), "quick": quick, "rows": rows, "results": results}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:  # the installed distribution's version: what torch.__version__ says, without importing torch
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        info["torch"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = Parser(__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny configurations, few repeats: checks that every benchmark runs; its figures are not to be quoted",
    )
    parser.add_argument("--only", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    parser.add_argument(
        # a str default, so that argparse runs output_file on it too (it makes benchmarks/results/,
        # git-ignored, absent in a fresh clone); argparse converts only str defaults
        "--json",
        type=output_file,
        default=str(RESULTS),
        help=f"where to write the JSON (default {RESULTS})",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    only = tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = set(only) - set(ORDER)
    if unknown:
        parser.error(f"unknown benchmark(s) in --only: {', '.join(sorted(unknown))} (known: {', '.join(ORDER)})")
    if not only:
        parser.error(f"--only names no benchmark (known: {', '.join(ORDER)})")
    result = run_all(args.quick, only)
    m = result["machine"]
    cpu = f"{m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('memory_gib', '?')} GiB"
    print(f"{cpu}; Python {m['python']}, torch {m['torch']}")
    if args.quick:
        print(QUICK_NOTE)
    print(table(result["rows"], markdown=args.markdown))
    print("ratio = ours / reference (lower is better); every figure a median over the repeats shown in the JSON")
    args.json.write_text(json.dumps(result, indent=2))
    print(f"written: {args.json}")
    return 1 if any(r.get("error") for r in result["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
