"""Tests that run inside a Transformer Engine twin process: TE's own Python from a release's wheel,
its compiled extension replaced by the CPU twin (harness/te_twin).

A test here is an ordinary test function marked `twin` that takes a `release` argument; it is
collected once per release in TWIN_RELEASES (the release is the first part of its id, so CI shows
the release x recipe x module matrix). Loading TE changes torch process-wide, so the body never
runs in the suite's own workers: the first test of a release starts one fresh interpreter that
loads that release on the twin and runs every test of the release (`TE_TWIN_RELEASE` set, the
other releases deselected); each test in the suite then reports its own outcome from there
(passed, skipped with the child's reason, or failed with the child's report). Under
`pytest -n 2 --dist loadgroup` one worker takes all tests of a twin process (release and GPU), so two
run at once. `TE_TWIN_RELEASES=2.20.2,2.9.0` limits the releases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import node_ids

from harness.te_twin.cells import BF16_ONLY, FULL_MATRIX, RECIPE_SINCE, TWIN_RELEASES, release_key

REPO = Path(__file__).resolve().parents[2]
CHILD = "TE_TWIN_RELEASE"  # set in the twin process: the release it loaded
CHILD_SM = "TE_TWIN_SM"  # and the GPU architecture it answers as (90 unless 100)
REPORT = "TE_TWIN_REPORT"  # where the twin process writes its tests' outcomes (JSON lines)
TIMEOUT = 900


def selected_releases() -> tuple[str, ...]:
    chosen = os.environ.get("TE_TWIN_RELEASES")
    if not chosen:
        return TWIN_RELEASES
    return tuple(r for r in TWIN_RELEASES if r in chosen.split(","))


def in_twin() -> str | None:
    """The release this interpreter runs on the twin, None in the suite's own processes."""
    return os.environ.get(CHILD)


def twin_sm() -> int:
    return int(os.environ.get(CHILD_SM, "90"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "twin(sm=90): runs in a TE twin process of its `release` answering as an sm90 GPU, or sm100 (a test's "
        "`sm` parameter chooses; without one, tests with recipe MXFP8BlockScaling or NVFP4BlockScaling get "
        "sm100) (tests/twin/conftest.py)",
    )
    release = in_twin()
    if release is not None:
        from harness import te_twin

        te_twin.load(release, sm=twin_sm())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("twin")
    if "release" in metafunc.fixturenames and marker:
        every = marker.kwargs.get("every_release", False)
        releases = [r for r in selected_releases() if every or r in FULL_MATRIX]
        metafunc.parametrize("release", releases, scope="function")


def _outside_the_matrix(item: pytest.Item) -> bool:
    """A cell not run: float32 and the per-copy controls outside FULL_MATRIX;
    a recipe the release does not have (RECIPE_SINCE); float32 cells of a recipe TE runs on bf16
    activations only (BF16_ONLY, whose refusal test_twin_kernels.py checks)."""
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    release = params.get("release")
    if release is None:
        return False
    if release_key(release) < RECIPE_SINCE.get(params.get("recipe", ""), (0,)):
        return True
    if params.get("recipe") in BF16_ONLY and params.get("dtype") == "float32":
        return True
    return release not in FULL_MATRIX and (params.get("dtype") == "float32" or "copy" in params)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    child = in_twin()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        process = _process_of(item)
        if process is not None and _outside_the_matrix(item):
            drop.append(item)
        elif process is None:
            (drop if child is not None else keep).append(item)  # the twin process runs twin tests only
        elif child is not None:
            (keep if process == (child, twin_sm()) else drop).append(item)
        else:
            if config.pluginmanager.hasplugin("xdist"):
                item.add_marker(pytest.mark.xdist_group(f"te-twin-{process[0]}-sm{process[1]}"))
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _process_of(item: pytest.Item) -> tuple[str, int] | None:
    """(release, sm) of the twin process that runs the item; None for a test not run on the twin."""
    callspec = getattr(item, "callspec", None)
    marker = item.get_closest_marker("twin")
    if callspec is None or marker is None or not isinstance(callspec.params.get("release"), str):
        return None  # not a twin test, or no release selected for it (pytest skips an empty parameter set)
    if "sm" in callspec.params:
        sm = int(callspec.params["sm"])
    else:
        blackwell = callspec.params.get("recipe") in ("MXFP8BlockScaling", "NVFP4BlockScaling")
        sm = 100 if blackwell else int(marker.kwargs.get("sm", 90))
    return callspec.params["release"], sm


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    process = _process_of(pyfuncitem)
    if process is None or in_twin() is not None:
        return None  # not a twin test, or the twin process running it
    release, sm = process
    outcomes = _twin_run(release, sm, pyfuncitem.config)
    record = outcomes.get(node_ids.plain(pyfuncitem))  # the twin process runs without xdist's group suffix
    if record is None:
        pytest.fail(f"the TE {release} twin process did not report {pyfuncitem.nodeid}:\n{outcomes.get('', '')}")
    if record["outcome"] == "skipped":
        pytest.skip(record["text"])
    if record["outcome"] != "passed":
        pytest.fail(f"in the TE {release} twin process ({record['when']}):\n{record['text']}", pytrace=False)
    return True


def _twin_run(release: str, sm: int, config: pytest.Config) -> dict[str, Any]:
    """The outcomes of the release's twin process ({nodeid: record}), run once per session."""
    from filelock import FileLock

    factory = config._tmp_path_factory  # type: ignore[attr-defined]
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / f"te-twin-{release}-sm{sm}.jsonl"
    with FileLock(str(shared / f"te-twin-{release}-sm{sm}.lock")):
        if not path.is_file():
            _run_child(release, sm, path)
    outcomes: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        outcomes[record["nodeid"]] = record
    return outcomes


def _run_child(release: str, sm: int, path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "NVTE_", "PYTEST_XDIST"))}
    env.update({CHILD: release, CHILD_SM: str(sm), REPORT: str(path) + ".part", "PYTHONPATH": str(REPO)})
    if os.environ.get("TEST_PYTHONPATH_PREFIX"):  # CI's torch 2.15.0 pass: that torch in the twin process too
        env["PYTHONPATH"] = os.pathsep.join([os.environ["TEST_PYTHONPATH_PREFIX"], str(REPO)])
    files = sorted(str(p.relative_to(REPO)) for p in Path(__file__).parent.glob("test_*.py"))
    args = [
        sys.executable,
        "-m",
        "pytest",
        *files,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-p",
        "no:randomly",
    ]
    args += ["--no-header", "-rN", f"--basetemp={path.parent / f'twin-{release}-sm{sm}'}"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=TIMEOUT)
        tail = (proc.stdout + proc.stderr)[-6000:]
    except subprocess.TimeoutExpired as exc:
        tail = f"timed out after {TIMEOUT} s: {exc.stdout!r}"[-6000:]
    part = Path(str(path) + ".part")
    lines = part.read_text().splitlines() if part.is_file() else []
    lines.append(json.dumps({"nodeid": "", "outcome": "log", "when": "", "text": tail}))
    path.write_text("\n".join(lines) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the twin process: write each test's outcome where the suite reads it."""
    target = os.environ.get(REPORT)
    if target is None or in_twin() is None:
        return
    if report.when == "call" or report.outcome != "passed":
        text = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.outcome == "failed":
            text = report.longreprtext[-8000:]
        record = {"nodeid": report.nodeid, "outcome": report.outcome, "when": report.when, "text": text}
        with open(target, "a") as out:
            out.write(json.dumps(record) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per TE release run on the twin (and its recipes), so CI output shows the matrix."""
    import re

    per: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "skipped", "failed"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            found = re.search(r"tests/twin/test_twin_\w+\.py::\w+\[(\d+\.\d+\.\d+)", nodeid)
            if found and (rep.when == "call" or outcome != "passed"):
                counts = per.setdefault(found.group(1), {"passed": 0, "skipped": 0, "failed": 0})
                counts[outcome] += 1
    if per:
        terminalreporter.section("Transformer Engine on the CPU twin (tests/twin)")
        for release in sorted(per, key=lambda r: tuple(int(p) for p in r.split(".")), reverse=True):
            c = per[release]
            terminalreporter.line(f"TE {release}: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed")
