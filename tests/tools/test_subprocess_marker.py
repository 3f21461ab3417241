"""`@pytest.mark.subprocess` reports each test as its child pytest ended it (tests/conftest.py,
tests/support/child_outcome.py).

Before issue 35 the suite turned the child's exit code into the outcome, and pytest exits 0 when its
test skipped or xfailed: a child that skipped was reported PASSED. The tests of
tests/support/subprocess_endings.py end each way a test can; they run here in a pytest of their own,
each in a child started as the suite starts it (forked from the fork server, in a fresh interpreter,
under pytest-xdist), and the summary must say what each child did.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENDINGS = "tests/support/subprocess_endings.py"
# test -> (what the summary says, the reason or message it gives)
EXPECTED = {
    "test_passes": ("PASSED", ""),
    "test_skips": ("SKIPPED", "skipped by the child's test body"),
    "test_skips_in_set_up": ("SKIPPED", "skipped by the child's fixture"),
    "test_skips_by_a_mark_of_the_child": ("SKIPPED", "skipped by a mark true in the child only"),
    "test_xfails": ("XFAIL", "xfailed by the child's test body"),
    "test_marked_xfail_raises": ("XFAIL", "xfail marked, raises"),
    "test_marked_xfail_passes": ("XPASS", "xfail marked, passes"),
    "test_marked_strict_xfail_passes": ("FAILED", "[XPASS(strict)] xfail marked strict, passes"),
    "test_fails": ("FAILED", f"{ENDINGS}:"),
    "test_runs_nothing": ("FAILED", "ran no test (exit code 5)"),
    "test_needs_a_missing_folder": ("SKIPPED", "a folder of the set-up not installed (run scripts/setup-env.sh)"),
    "test_chosen_at_collection_without_its_set_up": (
        "SKIPPED",
        "a folder chosen at collection not installed (run scripts/setup-env.sh)",
    ),
}
# Under CI=true (tests/support/set_up.py) a skip for a missing set-up fails; other skips stay skips.
UNDER_CI = {
    "test_needs_a_missing_folder": ("FAILED", "CI=true and a part of the set-up is missing: a folder of the set-up"),
    "test_chosen_at_collection_without_its_set_up": (
        "ERROR",
        "CI=true and a part of the set-up is missing: a folder chosen at collection",
    ),
}
WAYS = {
    "forked": ([], {}),
    "fresh": ([], {"TEST_NO_ZYGOTE": "1"}),
    "xdist": (["-n", "2", "--dist", "loadgroup"], {"TEST_NO_ZYGOTE": "1"}),
    "CI=true": ([], {"TEST_NO_ZYGOTE": "1", "CI": "true"}),
}


def _summary(way: str, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """{test: (outcome, reason)} from the short summary of a pytest run of ENDINGS."""
    args, extra = WAYS[way]
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith(("PYTEST_", "TEST_SUBPROCESS_"))}
    env.update(extra, COLUMNS="1000")  # the summary's lines whole
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", ENDINGS, "-rA", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'inner'}", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "short test summary info" in out, out[-6000:]
    lines = out.split("short test summary info", 1)[1].splitlines()
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        # SKIPPED [1] path:line: reason (no test id, so the reasons are distinct), or OUTCOME id - message
        skip = re.match(r"SKIPPED \[\d+\] (\S+?):\d+: (.*)", line)
        if skip:
            test = next((t for t, (o, r) in EXPECTED.items() if o == "SKIPPED" and r == skip.group(2)), skip.group(2))
            found[test] = ("SKIPPED", f"{skip.group(2)} (at {skip.group(1)})")
            continue
        other = re.match(rf"(\w+) {re.escape(ENDINGS)}::(\w+)(?:@\w+)?(?: - (.*))?$", line)
        if other:
            found[other.group(2)] = (other.group(1), other.group(3) or "")
    return found


@pytest.mark.parametrize("way", WAYS)
def test_each_child_is_reported_as_it_ended(way: str, tmp_path: Path) -> None:
    found = _summary(way, tmp_path)
    wrong = {}
    expected = {**EXPECTED, **UNDER_CI} if way == "CI=true" else EXPECTED
    for test, (outcome, reason) in expected.items():
        got = found.get(test, ("missing", ""))
        said = reason if outcome != "SKIPPED" else f"{reason} (at {ENDINGS})"  # the child's line, not conftest's
        if got[0] != outcome or said not in got[1]:
            wrong[test] = {"expected": (outcome, said), "got": got}
    assert not wrong, wrong
