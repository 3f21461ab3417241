"""One rank of a job, for `tests/cli/test_cli_gate.py`'s stats-file test: a function a spawned process
unpickles by reference. It lives here, not in the test module, because the spawned child imports the
module that defines it with the parent's `sys.path`, on which pytest has put several folders holding a
`conftest.py`: a test module that imports `conftest` gets whichever comes first (tests/twin's, under
xdist). This module imports nothing of the suite's plumbing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HOSTILE = Path(__file__).resolve().parents[1] / "hostile"


def one_rank(rank: str, clearings: int) -> None:
    """`clearings` offloads that clear, then one that clears nothing, which only the file written at
    exit counts."""
    os.environ["RANK"] = rank
    sys.path.insert(0, str(HOSTILE / "targets"))
    sys.path.insert(0, str(HOSTILE))
    import shim_targets  # type: ignore[import-not-found]
    from hostile_util import cached_layer  # type: ignore[import-not-found]

    import te_offload_shim

    assert te_offload_shim.installed()
    for _ in range(clearings):
        shim_targets.offload([cached_layer()])
    shim_targets.offload([])
