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


def one_rank(rank: str | None, clearings: int) -> None:
    """`clearings` offloads that clear, then one that clears nothing, which only the file written at
    exit counts. `rank` None: no rank at all (no launcher's variable, no process group)."""
    if rank is not None:
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


def one_torch_rank(rank: int, world: int, store: str, clearings: int) -> None:
    """A rank whose rank only `torch.distributed` knows (`init_process_group(rank=...)`, as
    `mp.spawn` jobs do; no launcher's variable): `clearings` offloads that clear, the process group
    destroyed, then one offload that clears nothing, so the file's last write (at exit) comes when no
    rank is known any more."""
    import torch.distributed as dist

    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(HOSTILE / "targets"))
    sys.path.insert(0, str(HOSTILE))
    import shim_targets  # type: ignore[import-not-found]
    from hostile_util import cached_layer  # type: ignore[import-not-found]

    import te_offload_shim
    from te_offload_shim import _switches

    assert te_offload_shim.installed() and _switches.rank() is None
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    assert _switches.rank() == str(rank)
    for _ in range(clearings):
        shim_targets.offload([cached_layer()])
    dist.barrier()
    dist.destroy_process_group()
    assert _switches.rank() is None, "no rank is known once the group is destroyed"
    shim_targets.offload([])
