"""Skips for a missing set-up (a `.deps` folder, TE's wheels, the package's editable install: what
scripts/setup-env.sh makes), which CI does not allow (scripts/smoke.sh does the same for a smoke venv).

Here a test whose set-up is missing skips and says what to run; under `CI=true` the same skip fails
the run, since CI runs scripts/setup-env.sh first and a folder missing there is a broken set-up, not a
test to leave out. Every such skip goes through `needs` (in a test) or `missing` (a mark, where the
test is chosen at collection), whose reasons end with `SET_UP`; tests/conftest.py's report hook calls
`fail_under_ci` on every report, which covers the skips of children and twin processes too: they
reach the suite as skips with their reasons.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SET_UP = "(run scripts/setup-env.sh)"


def needs(present: bool | Path, what: str) -> None:
    """Skip the running test unless `present` (a path that exists, or a true condition); `what`
    says what is missing."""
    __tracebackhide__ = True  # the skip points at the test's line
    if not (present.exists() if isinstance(present, Path) else present):
        pytest.skip(f"{what} {SET_UP}")


def missing(what: str) -> pytest.MarkDecorator:
    """The skip mark of a test chosen at collection whose set-up (`what`) is missing."""
    return pytest.mark.skip(reason=f"{what} {SET_UP}")


def fail_under_ci(report: pytest.TestReport) -> None:
    """Under `CI=true`, make a skip for a missing set-up a failure."""
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
    if reason.endswith(SET_UP):
        report.outcome = "failed"
        report.longrepr = f"CI=true and a part of the set-up is missing: {reason.removeprefix('Skipped: ')}"
