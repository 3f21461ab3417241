"""Mirror of Relax's selective train-state offload.

Upstream: redai-infra/Relax, relax/backends/megatron/weight_update/train_offload.py at 90d9adb2 (main;
no release). `_SelectiveOffloadStrategy(model, optimizer, args)` is what `MegatronTrainStateOffloader`
uses with `--selective-offload` or when torch_memory_saver is not preloaded. Its `offload(self)` copies
each DDP buffer's `param_data` (and `expert_parallel_buffers`) into a reused CPU `cpu_data`, frees the
device storage with `storage().resize_(0)`, frees grads, moves optimizer state, then `gc.collect()`
and `device_utils.empty_cache()` (a recorder here). `self.model` is the list of DDP chunks (may be
None). Why a mirror: Relax is not on PyPI. The optimizer part is left out.
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush
import torch


class _SelectiveOffloadStrategy:
    def __init__(self, model: list[Any] | None, optimizer: Any, args: Any) -> None:
        self.model = model
        self.optimizer = optimizer

    def _iter_ddp_buffers(self) -> Any:
        if self.model is None:
            return
        for ddp_model in self.model:
            for buffers in [getattr(ddp_model, "buffers", []) or [], getattr(ddp_model, "expert_parallel_buffers", [])]:
                yield from buffers

    @torch.no_grad()
    def offload(self) -> None:
        for buffer in self._iter_ddp_buffers():
            if buffer.param_data is not None and buffer.param_data.storage().size() > 0:
                cpu_data = getattr(buffer.param_data, "cpu_data", None)
                if cpu_data is None:
                    cpu_data = torch.empty_like(buffer.param_data, device=torch.device("cpu"))
                    buffer.param_data.cpu_data = cpu_data
                cpu_data.copy_(buffer.param_data.data, non_blocking=False)
                buffer.param_data_size = buffer.param_data.storage().size()
                buffer.param_data.storage().resize_(0)
            if buffer.grad_data is not None and buffer.grad_data.storage().size() > 0:
                buffer.grad_data_size = buffer.grad_data.storage().size()
                buffer.grad_data.storage().resize_(0)
        gc.collect()
        mirror_flush.empty_cache(self.model or [])  # upstream: device_utils.empty_cache()

    @torch.no_grad()
    def reload(self) -> None:
        for buffer in self._iter_ddp_buffers():
            if buffer.param_data.storage().size() == 0:
                buffer.param_data.storage().resize_(buffer.param_data_size)
                buffer.param_data.copy_(buffer.param_data.cpu_data)
