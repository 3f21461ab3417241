"""A `@pytest.mark.subprocess` test's outcome, carried from the child pytest that ran it to the suite.

The child's exit code cannot say it: pytest exits 0 when the test skipped or xfailed, so a child that
skipped was reported PASSED (issue 35). The child writes each phase's report of its one test as a JSON
line to the file named by `REPORT` (the conftest's `pytest_runtest_logreport`, whichever way the child
started: fresh or forked from tests/support/zygote.py, both take the environment the suite gives), and
the suite reports the test as the child did: a skip with its reason and location, an xfail, an xpass
(strict ones failed, as pytest itself reports them), a failure; a child that wrote nothing ran no test
(deselected, not found, died before it) and fails.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPORT = "TEST_SUBPROCESS_REPORT"  # in the child: the file its test's outcome goes to


def record(report: pytest.TestReport, nodeid: str | None) -> None:
    """In the child: append one phase's outcome of the test it runs (`nodeid`) to the suite's file."""
    path = os.environ.get(REPORT)
    if path is None or nodeid is None or report.nodeid != nodeid:
        return
    longrepr = report.longrepr if isinstance(report.longrepr, tuple) else report.longreprtext
    entry = {"when": report.when, "outcome": report.outcome, "longrepr": longrepr}
    if hasattr(report, "wasxfail"):
        entry["wasxfail"] = report.wasxfail
    with open(path, "a") as out:
        out.write(json.dumps(entry) + "\n")


@dataclass
class Outcome:
    """How the suite reports a child's test: `longrepr` is the skip's (path, line, "Skipped: reason")
    or the failure's text; `wasxfail` the xfail's reason, None when the test was not an xfail."""

    outcome: str  # "passed", "skipped" or "failed"
    longrepr: Any = None
    wasxfail: str | None = None

    def raise_here(self) -> None:
        """Raise in the suite's test what the child's test ended with (nothing for a pass)."""
        if self.outcome == "failed":
            pytest.fail(self.longrepr, pytrace=False)
        if self.outcome == "skipped" and self.wasxfail is not None:
            pytest.xfail(self.wasxfail)
        if self.outcome == "skipped":
            pytest.skip(str(self.longrepr[2]).removeprefix("Skipped: "))

    def onto(self, report: pytest.TestReport) -> None:
        """Make the suite's call report the child's: its own xfail marks are evaluated again here and
        would turn a failure of the child (a strict xpass among them) into an xfail, and a skip raised
        here would point at the conftest instead of the child's line."""
        report.outcome = self.outcome  # type: ignore[assignment]
        if self.outcome == "skipped" and self.wasxfail is None:
            report.longrepr = self.longrepr
        if self.wasxfail is None:
            report.__dict__.pop("wasxfail", None)
        else:
            report.wasxfail = self.wasxfail  # type: ignore[attr-defined]


KEY = pytest.StashKey[Outcome]()


def read(path: Path, rc: int, out: str, where: str) -> Outcome:
    """The suite's outcome of a child that exited with `rc` and printed `out`."""
    phases = []
    if path.is_file():
        phases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    failed = [p for p in phases if p["outcome"] == "failed"]
    if failed:
        said = (failed[0]["longrepr"] or "").strip().splitlines() or [""]  # its last line: where, or why
        return Outcome("failed", f"in {where} ({failed[0]['when']}): {said[-1]}\n{out[-12000:]}")
    # setup skipped (then no call ran), or the call's outcome
    ended = [p for p in phases if p["outcome"] == "skipped" or p["when"] == "call"]
    if not ended:
        return Outcome("failed", f"{where} ran no test (exit code {rc}):\n{out[-4000:]}")
    if rc != 0:  # e.g. it crashed at exit
        return Outcome("failed", f"in {where} (exit code {rc} after it {ended[0]['outcome']}):\n{out[-12000:]}")
    longrepr = ended[0]["longrepr"]
    longrepr = tuple(longrepr) if isinstance(longrepr, list) else longrepr
    return Outcome(ended[0]["outcome"], longrepr, ended[0].get("wasxfail"))
