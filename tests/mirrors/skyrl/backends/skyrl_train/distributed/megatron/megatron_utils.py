"""Mirror of SkyRL's Megatron offload (PyPI `skyrl`).

Upstream: NovaSky-AI/SkyRL, skyrl/backends/skyrl_train/distributed/megatron/megatron_utils.py at
tag skyrl-v0.3.0 f5bc3b78 (`offload_megatron_model_to_cpu` l.231; the same body since #1266, 2026-03-03,
in skyrl 0.1.0 - 0.3.0). Why a mirror: the real package does not import on Python 3.11 (the test
environment's): `skyrl/backends/__init__.py` pulls `skyrl.tinker.types`, whose `typing.TypedDict`
pydantic refuses before 3.12. Re-writes the lines that matter: DDP chunks go through megatron-core's
own `buffer.offload_to_cpu(move_params=True, move_grads=False)` (real megatron-core here), other
chunks (the reference model, built with `wrap_with_ddp=False`) move with `param.data.to("cpu")`, then
`gc.collect()` and `torch.cuda.empty_cache()` (a recorder here). The LoRA loop over frozen base
weights outside the buffers is left out (it needs CUDA tensors).
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
            for buffer in model_chunk.buffers + model_chunk.expert_parallel_buffers:
                buffer.offload_to_cpu(move_params=True, move_grads=False)
        else:
            for _, param in model_chunk.named_parameters():
                param.data = param.data.to("cpu", non_blocking=True)
    gc.collect()
    mirror_flush.empty_cache(models)  # upstream: torch.cuda.empty_cache()


@torch.no_grad()
def load_megatron_model_to_gpu(models: Any) -> None:
    for model_chunk in models:
        if isinstance(model_chunk, DDP):
            for buffer in model_chunk.buffers + model_chunk.expert_parallel_buffers:
                buffer.reload_from_cpu(move_params=True, move_grads=False)
