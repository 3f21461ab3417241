"""The suite's `--dist loadgroup` (scripts/test.sh) really sends each xdist_group to one worker.

pytest-xdist 3.8 marks a grouped test by appending `@group` to `item._nodeid` on the worker, and
the controller groups by that suffix of the node ids the workers report. pytest 9.2 no longer reads
`_nodeid`: the suffix is lost without an error, and a group's tests run on both workers, one waiting
on a file lock for the twin process (or TE probe) the other one runs, about 20 idle waits of 15-55 s
in one run of the suite. scripts/setup-env.sh pins pytest 9.1 for that reason; this test fails
under pytest 9.2 with xdist 3.8, and says which version broke it if a later pair does again.
"""

from __future__ import annotations

import pytest
from support import node_ids

pytestmark = pytest.mark.xdist_group("xdist-group-check")


def test_every_grouped_test_carries_its_group_to_the_scheduler(request: pytest.FixtureRequest) -> None:
    """Every collected test with an xdist_group mark (a module's own, as tests/te/test_te_real.py's,
    or one tests/twin/conftest.py adds per twin process) reports its node id with the group's
    suffix, which is all the controller groups by."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run under pytest-xdist's --dist loadgroup (scripts/test.sh runs the suite so)")
    grouped = [(item.nodeid, node_ids.group(item)) for item in request.session.items if node_ids.group(item)]
    assert grouped, "this test itself is grouped"
    lost = [nodeid for nodeid, group in grouped if not nodeid.endswith(f"@{group}")]
    versions = {name: __import__(name).__version__ for name in ("pytest", "xdist")}
    assert not lost, f"{len(lost)} of {len(grouped)} grouped tests lost their group under {versions}: {lost[:3]}"
