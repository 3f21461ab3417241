"""Tests that end each way a test can, each run in a child pytest (`@pytest.mark.subprocess`).

Not tests of the suite (the name is not `test_*.py`, and some fail on purpose):
tests/tools/test_subprocess_marker.py runs this file in a pytest of its own, whose conftest is
tests/conftest.py, and checks that each test is reported as its child ended it. The reasons are
distinct so that the summary names which test each line is about.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.set_up import missing, needs

IN_CHILD = os.environ.get("TEST_SUBPROCESS_NODEID") is not None  # this file imported by a child


@pytest.mark.subprocess
def test_passes() -> None:
    assert IN_CHILD


@pytest.mark.subprocess
@pytest.mark.xdist_group("endings")  # under --dist loadgroup its node id carries `@endings`, the child's not
def test_skips() -> None:
    pytest.skip("skipped by the child's test body")


@pytest.fixture
def missing_set_up() -> None:
    pytest.skip("skipped by the child's fixture")


@pytest.mark.subprocess
def test_skips_in_set_up(missing_set_up: None) -> None:
    raise AssertionError("never reached")


@pytest.mark.subprocess
@pytest.mark.skipif(IN_CHILD, reason="skipped by a mark true in the child only")
def test_skips_by_a_mark_of_the_child() -> None:
    raise AssertionError("never reached")


@pytest.mark.subprocess
def test_xfails() -> None:
    pytest.xfail("xfailed by the child's test body")


@pytest.mark.subprocess
@pytest.mark.xfail(reason="xfail marked, raises", strict=True)
def test_marked_xfail_raises() -> None:
    raise AssertionError("known to fail")


@pytest.mark.subprocess
@pytest.mark.xfail(reason="xfail marked, passes")
def test_marked_xfail_passes() -> None:
    assert IN_CHILD


@pytest.mark.subprocess
@pytest.mark.xfail(reason="xfail marked strict, passes", strict=True)
def test_marked_strict_xfail_passes() -> None:
    assert IN_CHILD


@pytest.mark.subprocess
def test_fails() -> None:
    assert not IN_CHILD, "a failure in the child"


@pytest.mark.subprocess(args=("-k", "no_test_has_this_name"))
def test_runs_nothing() -> None:
    raise AssertionError("never reached: the child deselects it")


@pytest.mark.subprocess
def test_needs_a_missing_folder() -> None:
    needs(Path(__file__).with_name("no-such-folder"), "a folder of the set-up not installed")


@pytest.mark.subprocess
@missing("a folder chosen at collection not installed")
def test_chosen_at_collection_without_its_set_up() -> None:
    raise AssertionError("never reached")
