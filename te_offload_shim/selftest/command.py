"""`te-offload-shim selftest`: on this node, does the shim hand TE's FP8 caches back to the driver?

It runs a measuring process (measure.py) twice: with the clearing off (`TE_OFFLOAD_SHIM=0`) and on
(this environment as it is). The on run is the path a job gets: the shim active in the process from
its start, an offload no table row knows (verl's, for chunks that are no DDP), and the flush net
clearing at that offload's own flush. Each run is a process of its own, so that its allocator,
CUDA context and TE globals start empty (the off run leaves nothing behind in the on run's figures),
and this process, which has the package installed (the CLI imports it), never touches the GPU: its
own context would sit in the driver's figures.

Exit 0: the on run's flush left none of the caches the off run kept; where the driver's figures are
measured, at least `SHARE` of the cache bytes came back to the driver beyond what the off run got
back; and the forward after the reload is bit-identical to the off run's, which kept its caches.
Exit 1: any of these fails, or a run failed. Exit 2: this machine cannot run it (no GPU, no TE, no
FP8 on this GPU), saying which. A figure the runs could not read is "not measured".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from te_offload_shim.selftest.measure import CANNOT

SHARE = 0.9  # of the cache bytes, back to the driver: the rest may share allocator blocks with live tensors
TIMEOUT = 900  # seconds, per run
NOT_MEASURED = "not measured"


def main(*, mib: float, hidden: int, recipe: str, as_json: bool) -> int:
    runs: dict[str, dict[str, Any]] = {}
    for clearing in ("off", "on"):
        runs[clearing] = _measure(clearing, ["--mib", str(mib), "--hidden", str(hidden), "--recipe", recipe])
        if "cannot" in runs[clearing] or "failed" in runs[clearing]:
            break
    code, verdict, figures = judge(runs)
    if as_json:
        print(json.dumps({"exit": code, "verdict": verdict, **_said(figures), **_said(runs)}, indent=2))
    else:
        _print(runs, figures)
    word = {0: "OK", 1: "FAILED", CANNOT: "cannot run here"}[code]
    print(f"te-offload-shim selftest: {word}: {verdict}", file=sys.stderr if code or as_json else sys.stdout)
    return code


def _measure(clearing: str, options: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("TE_OFFLOAD_SHIM_STATS", None)  # a measuring process is no rank of a job: it writes no stats file
    if clearing == "off":
        env["TE_OFFLOAD_SHIM"] = "0"
    with tempfile.TemporaryDirectory(prefix="te-offload-shim-selftest-") as folder:
        out = os.path.join(folder, "figures.json")
        command = [sys.executable, "-m", "te_offload_shim.selftest", out, *options]
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return {"failed": f"the run with the clearing {clearing} took over {TIMEOUT} s"}
        try:
            with open(out, encoding="utf-8") as file:
                result = json.load(file)
        except (OSError, ValueError):
            result = None
    if proc.returncode not in (0, CANNOT) or not isinstance(result, dict):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"failed": f"the run with the clearing {clearing} failed (exit {proc.returncode}): {last}"}
    return result


def judge(runs: dict[str, dict[str, Any]]) -> tuple[int, str, dict[str, Any]]:
    """(exit status, the verdict in one line, the figures compared) for the runs made."""
    for run in runs.values():
        if "cannot" in run:
            return CANNOT, run["cannot"], {}
        if "failed" in run:
            return 1, run["failed"], {}
    off, on = runs["off"], runs["on"]
    held, made = on["caches"]["bytes"], off["caches"]["entries"]
    freed = [_freed(run) for run in (off, on)]  # by the flush, as the driver sees it
    handed = None if None in freed else freed[1] - freed[0]  # type: ignore[operator]
    share = handed / held if handed is not None and held else None
    same = off["output"] == on["output"]
    figures = {"cache_bytes": held, "handed_back": handed, "share": share, "bit_identical": same}
    if not made:
        return 1, "TE made no FP8 caches here: nothing to hand back", figures
    if off["left"]["entries"] != made:
        return 1, "with the clearing off the caches went too: nothing to compare the clearing with", figures
    if on["left"]["entries"]:
        shim = on["shim"]
        why = "the net was armed and left them"
        if shim["net"] != "armed":
            why = f"the flush net is {shim['net']}: {shim['detail']}"
        if not shim["enabled"]:
            why = "the shim is switched off in this environment (TE_OFFLOAD_SHIM=0)"
        return 1, f"the clearing left {on['left']['entries']} of {on['caches']['entries']} FP8 caches ({why})", figures
    if not same:
        return 1, "the forward after the reload differs from the run that kept its caches", figures
    if share is not None and share < SHARE:
        return 1, f"the driver got back {_mib(handed)} of {_mib(held)} of caches ({share:.1%})", figures
    if share is None:
        return 0, "the clearing dropped every FP8 cache at the flush (the driver's figures not measured here)", figures
    return 0, f"the clearing handed {_mib(handed)} of {_mib(held)} of FP8 caches back to the driver", figures


def _freed(run: dict[str, Any]) -> int | None:
    before, after = run["before"]["free"], run["after"]["free"]
    return None if before is None or after is None else after - before


def _said(value: Any) -> Any:
    """The figures as printed: a None (a figure the run could not read) is "not measured"."""
    if isinstance(value, dict):
        return {key: _said(item) for key, item in value.items()}
    return NOT_MEASURED if value is None else value


def _mib(value: int | None) -> str:
    return NOT_MEASURED if value is None else f"{value / 2**20:,.2f} MiB"


def _change(before: int | None, after: int | None) -> str:
    return NOT_MEASURED if before is None or after is None else f"{before / 2**20:,.2f} -> {after / 2**20:,.2f} MiB"


def _print(runs: dict[str, dict[str, Any]], figures: dict[str, Any]) -> None:
    if not figures:
        return
    off, on = runs["off"], runs["on"]
    caches = f"{on['caches']['entries']} FP8 caches, {_mib(figures['cache_bytes'])}"
    print(f"te-offload-shim selftest: TE {on['te']}, {on['gpu']}, {on['recipe']}")
    print(f"  {on['layers']} x Linear({on['hidden']}): {caches}")
    print(f"  {'before -> after the flush':<26}{'clearing off':>34}{'clearing on':>34}")
    for label, key in (("driver free", "free"), ("allocated", "allocated"), ("reserved", "reserved")):
        cells = [_change(run["before"][key], run["after"][key]) for run in (off, on)]
        print(f"  {label:<26}{cells[0]:>34}{cells[1]:>34}")
    print(f"  {'FP8 caches left':<26}{off['left']['entries']:>34}{on['left']['entries']:>34}")
    share = figures["share"]
    back = NOT_MEASURED if share is None else f"{_mib(figures['handed_back'])} ({share:.1%} of the cache bytes)"
    same = "bit-identical to" if figures["bit_identical"] else "not"
    print(f"  handed back to the driver: {back}")
    print(f"  the forward after the reload: {same} the run that kept its caches")
