"""Which TE releases the twin runs (harness/te_twin/cells.py TWIN_RELEASES: every 2.x release the
class probe installs), and the one that it does not."""

from __future__ import annotations

import pytest

from harness import te_releases


def test_the_twin_runs_every_2x_release_the_class_probe_installs() -> None:
    from harness.te_twin.cells import NOT_TWINNED, TWIN_RELEASES

    releases_2x = {r for r in te_releases.RELEASES if te_releases.key(r) >= (2, 0)}
    assert set(TWIN_RELEASES) == releases_2x
    assert set(NOT_TWINNED) | releases_2x | {"1.9.0"} == set(te_releases.RELEASES)


def test_te_1x_on_the_twin() -> None:
    """TE 1.x: one skip with the reason (not one per cell)."""
    from harness.te_twin.cells import NOT_TWINNED

    pytest.skip(NOT_TWINNED["1.13.0"])
