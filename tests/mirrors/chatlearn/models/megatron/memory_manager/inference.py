"""Mirror of ChatLearn's memory manager for Megatron inference models (reference, reward).

Upstream: alibaba/ChatLearn, chatlearn/models/megatron/memory_manager/inference.py at b7af31a9
(`InferenceMemoryManager.offload_weights(self)` l.47, from v1.2.0). Why a mirror: as for
`trainer.py` beside it. Re-writes the lines that matter: `self._model` is a list of unwrapped chunks
(DDP refused in `__init__`); the parameters are grouped by dtype into flat tensors whose primary store
is the CPU, and `copy_to_primary_store()` moves them there. No flush inside: `TorchModule.offload`
flushes after it.
"""

from __future__ import annotations

from typing import Any


class InferenceMemoryManager:
    def __init__(self, model: list[Any], bucket_size_mb: int = 0) -> None:
        self._model = model
        self._weights_offloaded = False

    def offload_weights(self) -> None:
        if self._weights_offloaded:
            return
        for model_chunk in self._model:
            for p in model_chunk.parameters():
                p.data = p.data.to("cpu", copy=True)  # BucketizedFlatTensors(..., 'cpu').copy_to_primary_store()
        self._weights_offloaded = True
