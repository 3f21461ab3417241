"""Mirror of the older SkyRL layout's Megatron offload (package `skyrl_train`).

Upstream: NovaSky-AI/SkyRL, skyrl-train/skyrl_train/distributed/megatron/megatron_utils.py at tag
skyrl_train-v0.4.0 332c7cbc (`offload_megatron_model_to_cpu` l.150; from skyrl_train-v0.2.0). Why a
mirror: `skyrl-train` (PyPI, 0.3.1 at most) cannot be downloaded from the package index this set-up
reaches, and later code lives in the `skyrl` package (see the `skyrl` mirror). Re-writes the lines
that matter: verl's pre-fix copy (pinned CPU copy of each DDP buffer's `param_data`,
`storage().resize_(0)`, `.to("cpu")` for other chunks), then `gc.collect()` and
`torch.cuda.empty_cache()` (a recorder here).
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush
import torch
from megatron.core.distributed import DistributedDataParallel as DDP


@torch.no_grad()
def offload_megatron_model_to_cpu(models: Any) -> None:
    for model_chunk in models:
        if isinstance(model_chunk, DDP):
            for buffers in [model_chunk.buffers, model_chunk.expert_parallel_buffers]:
                for buffer in buffers:
                    if buffer.param_data.storage().size() > 0:
                        buffer.param_data.cpu_data = buffer.param_data.data.cpu().pin_memory()
                        buffer.param_data_size = buffer.param_data.storage().size()
                        buffer.param_data.storage().resize_(0)
        else:
            for _, param in model_chunk.named_parameters():
                param.data = param.data.to("cpu", non_blocking=True)
    gc.collect()
    mirror_flush.empty_cache(models)  # upstream: torch.cuda.empty_cache()
