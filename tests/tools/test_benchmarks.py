"""The benchmarks run and measure what they claim, in tiny configurations (`--quick`, `--dry-run`).

No timing is asserted: figures belong in BENCHMARKS.md. These check structure and sanity: both
sides of each comparison did the same work, without the shim the caches stay, with it none is left.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.set_up import needs

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import gpu_memory  # noqa: E402


def _run(script: str, *args: str, timeout: int = 240, **extra_env: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    env.update(extra_env)
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(BENCH / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    result = _common.parse_result(proc.stdout)
    assert proc.returncode == 0 and result is not None, (
        f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return result, proc.stdout


def _assert_within_width(stdout: str) -> None:
    """Every printed line but the machine-readable result fits the table width."""
    wide = [line for line in stdout.splitlines() if not line.startswith(_common.RESULT_PREFIX)]
    assert max(map(len, wide)) <= _common.WIDTH, "\n".join(line for line in wide if len(line) > _common.WIDTH)


def _verl(version: str) -> None:
    needs(REPO / ".deps" / f"verl-{version}" / "verl", f"verl {version} not installed")


def test_ab_alternates_prepares_and_takes_medians() -> None:
    calls: list[str] = []
    figures = _common.ab(
        lambda: calls.append("ours"),
        lambda: calls.append("reference"),
        repeats=4,
        prepare=lambda: calls.append("prepare"),
    )
    assert calls[:6] == ["prepare", "ours", "prepare", "reference", "prepare", "reference"]
    assert calls.count("ours") == calls.count("reference") == 4 and calls.count("prepare") == 8
    assert figures["repeats"] == 4 and len(figures["ours_samples_s"]) == 4
    assert figures["ratio"] == pytest.approx(figures["ours_s"] / figures["reference_s"])


def test_walk_both_sides_clear_the_same_tree() -> None:
    _verl("0.9.1")
    result, stdout = _run("walk.py", "--quick")
    # the MoE cases add "collector left on", the flat ones "collector on for both"
    assert len(result["cases"]) == 4 and len(result["rows"]) == 12
    assert [case["tree"] for case in result["cases"]] == ["moe", "moe", "flat", "flat"]
    for case in result["cases"]:
        assert case["modules"] >= 400 and case["te_modules"] > 0
        assert case["entries"] > 0 and case["bytes_accounted"] > 0
        # every timed call of either side cleared every entry (walk.py also checks none was left)
        assert case["cleared"] == {"ours": [case["entries"]], "reference": [case["entries"]]}
        assert case["ours_s"] > 0 and case["reference_s"] > 0 and case["walk_only"]["ours_s"] > 0
        if case["tree"] == "moe":  # the collector left on against switched off for the call
            assert case["collector_on"]["ours_s"] > 0 and case["collector_on"]["reference_s"] > 0
        else:  # the dense worst case, the collector on for ours and the reference
            assert case["collector_on_both"]["ours_s"] > 0 and case["collector_on_both"]["reference_s"] > 0
    assert [r["case"].endswith("collector left on") for r in result["rows"]].count(True) == 2
    assert [r["case"].endswith("collector on for both") for r in result["rows"]].count(True) == 2
    assert "clearing walk" in stdout and "ratio" in stdout
    assert _common.QUICK_NOTE in stdout
    _assert_within_width(stdout)


def test_net_check_clears_nothing_on_the_device_and_without_te_the_flush_is_torchs_own() -> None:
    _verl("0.9.1")
    result, stdout = _run("net.py", "--quick")
    assert [r["case"].split(":")[0] for r in result["rows"]] == ["nothing to clear"] * 4 + [
        "arming after TE",
        "TE never imported",
    ]
    *checks, armed = result["cases"]
    # the same model with plain weights, then with TE's own Float8Tensor as every weight (FP8 primary)
    assert [c["fp8_primary_weights"] for c in checks] == [False, False, True, True], checks
    assert all("FP8 primary weights" in r["case"] for r in result["rows"][2:4]), result["rows"]
    # the arming search found every TE layer of the model in the heap, and was timed against gc.collect
    assert armed["te_layers"] == checks[-1]["te_layers"] and armed["heap_objects"] > 10 * armed["te_layers"], armed
    assert armed["ours_s"] > 0 and armed["reference_s"] > 0
    for case in checks:
        assert case["te_layers"] >= 100 and case["live_layers"] == case["te_layers"], case
        assert case["modules"] > 3 * case["te_layers"] and case["entries"] > case["te_layers"]
        # every timed call of ours was a flush the net looked at, and it cleared nothing (net.py also
        # checks every cache was still there; verl's walk cleared them all, every time)
        assert case["net_flushes"] == case["repeats"] and case["net_cleared"] == 0, case
        assert case["ours_s"] > 0 and case["reference_s"] > 0
    probe = result["no_te"]
    assert probe == {
        "same_object": True,
        "module": "torch.cuda.memory",
        "file": "torch/cuda/memory.py",
        "wrapped": False,
        "te_imported": False,
        "net": "not armed",
    }, probe
    assert "flush net" in stdout and _common.QUICK_NOTE in stdout
    _assert_within_width(stdout)


def test_residue_audit_runs_the_audit_and_counts_the_resident_tree() -> None:
    result, stdout = _run("residue.py", "--quick")
    (case,) = result["cases"]
    assert [r["case"].split(": ")[1] for r in result["rows"]] == ["after the shim's offload", "everything resident"]
    assert case["after_offload_total_bytes"] == 0, "the audited tree has nothing on a device"
    assert case["worst_storages"] > case["entries"] > 0
    assert case["worst_by_category"]["fp8_workspaces"] > 0 and case["worst_by_category"]["parameters"] > 0
    assert case["after_offload"]["ours_s"] > 0 and case["worst"]["reference_s"] > 0
    assert "residue audit" in stdout
    _assert_within_width(stdout)  # its notes are the longest: they wrap under the note column


def test_offload_overhead_same_offload_work_except_clearing() -> None:
    _verl("0.8.0")
    result, stdout = _run("offload_overhead.py", "--quick")
    entries = result["cache_entries"]
    assert entries > 0 and result["cache_bytes"] > 0
    assert result["entries_left"] == {"ours": [0], "reference": [entries]}
    assert result["shim_stats"]["entries"] >= entries * result["repeats"]
    assert result["shim_alone_ms"] > 0 and 0 < result["shim_alone_share"] < 1
    assert [r["benchmark"] for r in result["rows"]] == ["per-offload", "per-offload"]
    _assert_within_width(stdout)


def test_gpu_memory_dry_run(tmp_path: Path) -> None:
    _verl("0.8.0")
    out = tmp_path / "gpu.json"
    # with the ray stub, as on the GPU machine (which carries no ray wheel)
    result, stdout = _run("gpu_memory.py", "--dry-run", "--json", str(out), GPU_MEMORY_STUB_RAY="1")
    assert result["ok"] and result["dry_run"] and json.loads(out.read_text())["ok"]
    without, with_ = result["cases"]["without"], result["cases"]["with"]
    assert without["shim_layers"] == 0 and with_["shim_layers"] == 1
    assert without["caches_before"]["entries"] > 0 and without["caches_before"]["bytes"] > 0
    assert without["caches_after"] == without["caches_before"], "without the shim the caches remain"
    assert with_["caches_after"] == {"entries": 0, "bytes": 0}, "with the shim none is left"
    assert without["params_offloaded"] and with_["params_offloaded"]
    assert without["ray"] == with_["ray"] == "stub"
    assert without["after"]["allocated"] is None  # memory figures are n/a on CPU
    assert "stand-ins" in without["caches_made_with"] and "as expected" in stdout


def _case(entries_after: int, alloc_after: int | None, free_after: int | None, layers: int) -> dict:
    mem = {"allocated": alloc_after, "reserved": alloc_after, "free": free_after, "total": None}
    return {
        "shim_layers": layers,
        "params_offloaded": True,
        "caches_before": {"entries": 9, "bytes": 1000},
        "caches_after": {"entries": entries_after, "bytes": 1000 if entries_after else 0},
        "before": mem,
        "after": mem,
    }


def test_gpu_memory_verdict_flags_caches_that_stay() -> None:
    good = {"without": _case(9, 1100, 5000, 0), "with": _case(0, 100, 6000, 1)}
    assert gpu_memory.verdict(good) == (True, [])
    still_cached = {"without": _case(9, 1100, 5000, 0), "with": _case(9, 1100, 5000, 1)}
    ok, problems = gpu_memory.verdict(still_cached)
    assert not ok and len(problems) == 3  # entries left, allocated not lower, driver got nothing back
    not_freed = {"without": _case(9, 1100, 5000, 0), "with": _case(0, 1100, 5000, 1)}
    assert not gpu_memory.verdict(not_freed)[0]


def _run_quick_gpu(run_py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """run.py --quick --only gpu: "gpu" alone is the cheapest subset (without CUDA it is one "not
    available" row)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    command = [sys.executable, str(run_py), "--quick", "--only", "gpu", *args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_run_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    proc = _run_quick_gpu(BENCH / "run.py", "--json", str(out))
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"gpu"} and result["machine"]["cpus"]
    assert result["rows"] and all(r["benchmark"] == "gpu memory" for r in result["rows"])
    lines = proc.stdout.splitlines()
    assert lines[1] == _common.QUICK_NOTE, "a --quick run says its figures are not to be quoted"
    assert lines[2].split()[:6] == ["benchmark", "case", "ours", "reference", "unit", "ratio"]
    _assert_within_width(proc.stdout)


def test_table_puts_ours_reference_and_ratio_side_by_side() -> None:
    rows = [_common.row("walk", "10 modules", {"ours_s": 0.001, "reference_s": 0.004, "ratio": 0.25, "repeats": 3})]
    text = _common.table(rows).splitlines()
    assert text[2].split()[:6] == ["walk", "10", "modules", "1.000", "4.000", "ms"]
    assert "0.250" in text[2]
    assert _common.table(rows, markdown=True).startswith("| benchmark | case | ours | reference |")


def test_table_wraps_long_cases_and_notes_under_their_column() -> None:
    figures = {"ours_s": 0.5, "reference_s": 0.1, "ratio": 5.0, "repeats": 3}
    note = "audit.begin+finish (walk, report, log line), nothing on a device, caches cleared " * 3
    case = "100,006 modules: after the shim's offload, everything resident"
    rows = [_common.row("residue audit", case, figures, note=note), _common.row("walk", "10 modules", figures)]
    lines = _common.table(rows).splitlines()
    assert max(map(len, lines)) <= _common.WIDTH
    case_at, ours_at, note_at = (lines[0].index(h) for h in ("case", "ours", "note"))
    walk = next(i for i, line in enumerate(lines) if line.startswith("walk "))
    first = lines[2:walk]
    assert len(first) > 2 and all(line[:case_at].strip() == "" for line in first[1:]), "continuations are indented"
    # nothing lost: the wrapped words read back as the case and the note
    assert " ".join(line[case_at:ours_at].strip() for line in first).split() == case.split()
    assert " ".join(line[note_at:] for line in first).split() == note.split()


SCRIPTS = ("walk.py", "offload_overhead.py", "residue.py", "startup.py", "run.py", "gpu_memory.py")
# walk.py and residue.py import torch at their top (10-15 s on the CI VM): their --help is the
# shared `_common.main` one, exercised here through offload_overhead.py, with their own docstring.
CHEAP_HELP = ("offload_overhead.py", "startup.py", "run.py", "gpu_memory.py")


def test_help_says_the_whole_first_paragraph_and_every_option() -> None:
    for script in SCRIPTS:
        doc = ast.get_docstring(ast.parse((BENCH / script).read_text())) or ""
        first = _common.description(doc)
        assert first.endswith("."), f"{script}: the docstring's first paragraph is not a whole sentence"
        if script not in CHEAP_HELP:
            continue
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", str(BENCH / script), "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "100", "PYTHONPATH": str(REPO)},
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert first in " ".join(proc.stdout.split()), f"{script} --help cuts its description:\n{proc.stdout}"
        options = proc.stdout.split("options:", 1)[1]
        bare = [line for line in options.splitlines() if line.strip().startswith("--") and "  " not in line.strip()]
        assert not bare, f"{script}: options without help: {bare}"


def test_bad_arguments_are_one_line_errors() -> None:
    for script, args, says in (
        ("startup.py", ["--runs", "0"], "--runs: must be at least 1, got 0"),
        ("run.py", ["--only", "walk,wlak"], "unknown benchmark(s) in --only: wlak"),
        ("gpu_memory.py", ["--json", str(REPO)], "is a directory, not a file"),
    ):
        proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_startup_rows_and_nothing_foreign_at_start_up() -> None:
    """startup.py in a tiny configuration: its rows against `python -c pass` (bare, and in a training
    environment), and the .pth adds no module from outside the package (figures are not checked:
    timings here are noise)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "startup.py"), "--runs", "3"], capture_output=True, text=True, env=env, timeout=300
    )
    result = _common.parse_result(proc.stdout)
    assert result is not None, proc.stderr[-3000:]
    rows = result["rows"]
    assert [r["case"] for r in rows] == [
        "interpreter start, .pth active",
        "interpreter start in a training environment, .pth active",
        "import te_offload_shim",
    ]
    assert all(r["ours"] > 0 and r["reference"] > 0 for r in rows)
    added = result["modules_added"]
    assert "te_offload_shim" in added
    assert [m for m in added if m.split(".")[0] != "te_offload_shim"] == []


def test_run_writes_its_default_json_in_a_fresh_clone(tmp_path: Path) -> None:
    """benchmarks/results/ is git-ignored, so a fresh clone has none: the default --json makes it."""
    import shutil

    copy = tmp_path / "benchmarks"
    shutil.copytree(BENCH, copy, ignore=shutil.ignore_patterns("results", "__pycache__"))
    _run_quick_gpu(copy / "run.py")
    assert json.loads((copy / "results" / "latest.json").read_text())["results"].keys() == {"gpu"}
