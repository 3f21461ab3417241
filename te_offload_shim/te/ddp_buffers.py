"""Megatron DDP's buffer lists, by name: the one place both readers of them take the names from,
the megatron-core target's owner search (integrations/megatron.py) and the residue report
(reports/residue.py). Here, below both, as Megatron's CUDA-graph marks are in te/graphs.py:
attribute names only, nothing is imported.

megatron/core/distributed/distributed_data_parallel.py (core_v0.12 - 0.16): `self.buffers` holds
the dense parameters' `_ParamAndGradBuffer`s, `self.expert_parallel_buffers` the expert-parallel
ones (apart, with their own data-parallel group).
"""

from __future__ import annotations

from typing import Any

DDP_BUFFER_LISTS = ("buffers", "expert_parallel_buffers")


def ddp_buffers(fields: dict) -> list[Any]:
    """The buffers a DDP's instance fields hold, dense first."""
    return [buffer for name in DDP_BUFFER_LISTS for buffer in fields.get(name) or ()]
