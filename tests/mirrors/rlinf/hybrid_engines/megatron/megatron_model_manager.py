"""Mirror of RLinf's Megatron model manager (PyPI `rlinf`).

Upstream: RLinf/RLinf, rlinf/hybrid_engines/megatron/megatron_model_manager.py at tag v0.3 05054318
(`MegatronModelManager.offload_model_weights_and_grad` l.753; the same in the `rlinf` 0.3.0 wheel,
and present from v0.1). Why a mirror: the real module imports Megatron-LM's `megatron.training`
and `megatron.legacy` (l.68-69; `rlinf/utils/initialize.py` l.33), which are not on PyPI
(megatron-core's wheel ships only `megatron.core`). Re-writes the lines that matter: the signature
`(self, offload_grad=True, offload_weight=True)`, the early return when already offloaded,
`self.model` as the list of chunks, each DDP buffer's `param_data` copied to a pinned CPU buffer then
`untyped_storage().resize_(0)` only when `offload_weight`, grads freed when `offload_grad`, and
`clear_memory()` (synchronize, gc, ipc_collect, empty_cache; a recorder here) at its end.
`MegatronWorker(MegatronModelManager, Worker)` inherits the method.
"""

from __future__ import annotations

from typing import Any

import mirror_flush
import torch
from megatron.core.distributed import DistributedDataParallel as DDP


class MegatronModelManager:
    def __init__(self, models: list[Any]) -> None:
        self.model = models
        self.is_weight_offloaded = False
        self.is_grad_offloaded = False
        self._pinned: dict[int, torch.Tensor] = {}

    def _get_pinned_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        key = id(tensor)
        if key not in self._pinned:
            self._pinned[key] = torch.empty_like(tensor, device="cpu")
        return self._pinned[key]

    def offload_model_weights_and_grad(self, offload_grad: bool = True, offload_weight: bool = True) -> None:
        if (not offload_grad or self.is_grad_offloaded) and (not offload_weight or self.is_weight_offloaded):
            return
        for model_chunk in self.model:
            if isinstance(model_chunk, DDP):
                for buffer in model_chunk.buffers:
                    if (
                        offload_weight
                        and not self.is_weight_offloaded
                        and buffer.param_data.untyped_storage().size() > 0
                    ):
                        param_size = buffer.param_data.untyped_storage().size()
                        cpu_data = self._get_pinned_buffer(buffer.param_data)
                        cpu_data.copy_(buffer.param_data, non_blocking=True)
                        buffer.param_data_size = param_size
                        buffer.param_data.untyped_storage().resize_(0)
                    if offload_grad and not self.is_grad_offloaded and buffer.grad_data.untyped_storage().size() > 0:
                        buffer.grad_data_size = buffer.grad_data.untyped_storage().size()
                        buffer.grad_data.untyped_storage().resize_(0)
        mirror_flush.empty_cache(self.model)  # upstream: clear_memory()
        if offload_grad:
            self.is_grad_offloaded = True
        if offload_weight:
            self.is_weight_offloaded = True

    def onload_model_weights_and_grad(self, load_grad: bool = True) -> None:
        for model_chunk in self.model:
            for buffer in model_chunk.buffers:
                if buffer.param_data.untyped_storage().size() == 0:
                    buffer.param_data.untyped_storage().resize_(buffer.param_data_size)
                    buffer.param_data.copy_(self._get_pinned_buffer(buffer.param_data))
        self.is_weight_offloaded = False
