"""Mutation testing (scripts/mutation.sh, mutmut): what the interpreters a test starts reach.

mutmut runs the selected tests once with `MUTANT_UNDER_TEST=stats`, the mutated functions recording
each call in the process (`mutmut.state`), and so learns which tests reach which function; each
mutant then runs only the tests that reached its function, and a function no test reached has its
mutants reported as "no tests", never run. An interpreter a test starts (a `@pytest.mark.subprocess`
child, a probe, a forked child) records in its own memory, lost with it: the hook's fork, signal
and start-up paths, reached only there, would all be "no tests".

So in that run each interpreter started from mutmut's copy of the repository appends every function
it reaches, when it first reaches it, to a file this plugin names (`support/mutmut_sitecustomize.py`,
which scripts/mutation.sh puts there as `sitecustomize.py`), and this plugin adds the file to the
running test's record before mutmut reads it, at the test's teardown. The mutant runs need nothing
of this: the interpreters inherit `MUTANT_UNDER_TEST`, and import the mutated package from mutmut's
copy, where the tests run. Loaded by mutmut's pytest runs only (`-p tests.support.mutation`,
pyproject.toml's [tool.mutmut]).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

HITS = "TEST_MUTMUT_HITS"  # the file the started interpreters append the functions they reach to


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        os.environ[HITS] = str(Path(tempfile.mkdtemp(prefix="mutmut-hits-")) / "hits")


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.pop(HITS, None)
    if path is not None:
        Path(path).unlink(missing_ok=True)
        Path(path).parent.rmdir()


@pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook, which files what was reached under the test
def pytest_runtest_teardown(item: pytest.Item) -> None:
    path = os.environ.get(HITS)
    state = sys.modules.get("mutmut.state")
    if path is None or state is None or not os.path.exists(path):
        return
    reached = Path(path).read_text().split()
    Path(path).unlink()
    state.state()._stats.update(reached)
