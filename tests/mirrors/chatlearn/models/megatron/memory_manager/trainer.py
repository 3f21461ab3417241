"""Mirror of ChatLearn's memory manager for Megatron training models.

Upstream: alibaba/ChatLearn, chatlearn/models/megatron/memory_manager/trainer.py at b7af31a9
(2025-10-23; `TrainerMemoryManager.offload_weights(self)` l.173; the class and file exist from v1.2.0,
2025-08). Why a mirror: ChatLearn is not on PyPI (its distribution `pai-chatlearn` is installed from
source) and its Megatron modules import Megatron-LM's `megatron.training`, which is not on PyPI
either. Re-writes the lines that matter, for the distributed-optimizer path: `self._model` is the
list of DDP chunks; each buffer's `param_data` goes to a CPU primary store and the GPU flat buffer is
released (`BucketizedFlatTensors.copy_to_primary_store` -> `release_gpu_buffer`); every parameter's
`data` becomes an empty tensor. There is no flush inside: its caller `TorchModule.offload`
(chatlearn/models/torch_module.py l.158) calls it and then `torch.cuda.empty_cache()`.
"""

from __future__ import annotations

from typing import Any

import torch


class TrainerMemoryManager:
    def __init__(self, model: list[Any], optimizer: Any = None, bucket_size_mb: int = 0) -> None:
        self._model = model
        self._optimizer = optimizer
        self._buffers = [b for chunk in model for b in chunk.buffers]
        self._weights_offloaded = False
        self._primary: list[torch.Tensor] | None = None

    def offload_weights(self) -> None:
        if self._weights_offloaded:
            return
        if self._primary is None:
            self._primary = [torch.empty_like(b.param_data, device="cpu") for b in self._buffers]
        for store, buffer in zip(self._primary, self._buffers, strict=True):
            store.copy_(buffer.param_data)  # copy_to_primary_store
            buffer.param_data.untyped_storage().resize_(0)  # release_gpu_buffer
        for model_chunk in self._model:
            for p in model_chunk.parameters():
                p._saved_shape = p.shape
                p.data = torch.Tensor()  # FlatTensors._EMPTY_TENSOR
        self._weights_offloaded = True

    def onload_weights(self) -> None:
        assert self._primary is not None
        for store, buffer in zip(self._primary, self._buffers, strict=True):
            buffer.param_data.untyped_storage().resize_(store.untyped_storage().size())
            buffer.param_data.copy_(store)
        for buffer in self._buffers:
            for param, (start, _end, _bucket) in buffer.param_index_map.items():
                param.data = buffer.param_data[start : start + param._saved_shape.numel()].view(param._saved_shape)
        self._weights_offloaded = False
