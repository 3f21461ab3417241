"""Mirror of SkyRL's newest Megatron weight offload, under a module name no target row watches (as a
fork's or a research project's copy of the function would be): the proof of the allocator-flush net
(tests/twin/test_twin_net.py). The `skyrl` row watches SkyRL's own module; a copy anywhere else has
only the net.

Upstream: NovaSky-AI/SkyRL, skyrl/backends/skyrl_train/distributed/megatron/megatron_utils.py, the
revision of main that adds `offload_megatron_model_to_cpu(models, is_lora: bool = False)` and
`load_megatron_model_to_gpu(models, is_lora: bool = False)` (read through the code index, which does
not record that revision's commit; the newest commit checked out here, a9564572 of 2026-08-21, has
the same body without the `is_lora` switch). The flush is the caller's:
skyrl/backends/skyrl_train/distributed/megatron/megatron_strategy.py at a9564572,
`MegatronStrategy.offload_to_cpu` (l.217-232): the model offload, then `torch.cuda.synchronize()` and
`torch.cuda.empty_cache()`. Re-writes only the lines that matter:
- DDP chunks: unless `is_lora`, every buffer through megatron-core's own
  `buffer.offload_to_cpu(move_params=True, move_grads=False)`; then (both ways) every parameter that is
  on CUDA, frozen (`not requires_grad`), not an adapter (`"adapter" not in name`) and not yet freed
  (`param.data.storage().size() > 0`) keeps a pinned CPU copy in `param._offload_cpu_data` and becomes
  `torch.empty(0, dtype=param.data.dtype, device=param.data.device)`: a zero-byte tensor still on CUDA;
- other chunks: `param.data = param.data.to("cpu", non_blocking=True)`;
- the reload: the buffers' `reload_from_cpu(move_params=True, move_grads=False)` unless `is_lora`, the
  frozen weights back from `_offload_cpu_data` where their storage is empty, plain chunks to the device.
Left out: the file-backed frozen copies (`SKYRL_FROZEN_OFFLOAD_DIR`; the pinned-RAM fallback is kept),
the grad and optimizer offloads of `offload_to_cpu`.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.distributed import DistributedDataParallel as DDP


@torch.no_grad()
def offload_megatron_model_to_cpu(models: Any, is_lora: bool = False) -> None:
    for model_chunk in models:
        if isinstance(model_chunk, DDP):
            if not is_lora:  # LoRA: the fused buffers hold only the adapters, which stay resident
                for buffer in model_chunk.buffers + model_chunk.expert_parallel_buffers:
                    buffer.offload_to_cpu(move_params=True, move_grads=False)
            for name, param in model_chunk.named_parameters():
                if (
                    param.is_cuda
                    and not param.requires_grad
                    and "adapter" not in name
                    and param.data.storage().size() > 0
                ):
                    if getattr(param, "_offload_cpu_data", None) is None:
                        param._offload_cpu_data = param.data.detach().cpu().pin_memory()
                    param._offload_cuda_numel = param.data.numel()
                    param.data = torch.empty(0, dtype=param.data.dtype, device=param.data.device)
        else:
            for _, param in model_chunk.named_parameters():
                param.data = param.data.to("cpu", non_blocking=True)


@torch.no_grad()
def load_megatron_model_to_gpu(models: Any, is_lora: bool = False) -> None:
    for model_chunk in models:
        if isinstance(model_chunk, DDP):
            if not is_lora:
                for buffer in model_chunk.buffers + model_chunk.expert_parallel_buffers:
                    buffer.reload_from_cpu(move_params=True, move_grads=False)
            device_id = torch.cuda.current_device()
            for _, param in model_chunk.named_parameters():
                if hasattr(param, "_offload_cpu_data") and param.data.storage().size() == 0:
                    param.data = param._offload_cpu_data.to(device_id, non_blocking=True)
        else:
            device_id = torch.cuda.current_device()
            for _, param in model_chunk.named_parameters():
                param.data = param.data.to(device_id, non_blocking=True)


def offload_to_cpu(models: Any, is_lora: bool = False) -> None:
    """The model part of `MegatronStrategy.offload_to_cpu`, with its flush."""
    offload_megatron_model_to_cpu(models, is_lora=is_lora)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
