"""Mirror of AReaL's awex colocated writer.

Upstream: areal-project/AReaL, areal/engine/awex/colocate_writer.py at cbff54d6 (added by 76138cb3
"#1500", 2026-08-07; in no release yet). Re-writes only the lines that matter:
`AwexMegatronAdapter.release_memory(self, tags: list[str] | None = None)` (l.505) with its
`tags = tags or ["optimizer", "weights"]` default and released-tags bookkeeping, `_offload_model_weights`
(l.539-556) reaching each DDP buffer's `offload_to_cpu()` through `self._engine.model`, and the
`torch.cuda.synchronize(); gc.collect(); torch.cuda.empty_cache()` at its end replaced by a recorder.
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush


class AwexMegatronAdapter:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._released_tags: set[str] = set()

    def release_memory(self, tags: list[str] | None = None) -> None:
        tags = tags or ["optimizer", "weights"]
        tags_to_release = [t for t in tags if t not in self._released_tags]
        if not tags_to_release:
            return
        if "optimizer" in tags_to_release:
            self._released_tags.add("optimizer")  # upstream: self._offload_optimizer_states()
        if "weights" in tags_to_release:
            self._offload_model_weights()
            self._released_tags.add("weights")
        gc.collect()
        mirror_flush.empty_cache(self._engine.model)  # upstream: torch.cuda.empty_cache()

    def _offload_model_weights(self) -> None:
        from megatron.core.distributed import DistributedDataParallel as DDP

        model = self._engine.model
        if model is None:
            return
        if not isinstance(model, (list, tuple)):
            model = [model]
        for chunk in model:
            if isinstance(chunk, DDP):
                for buffers in [chunk.buffers, chunk.expert_parallel_buffers]:
                    for buf in buffers:
                        if hasattr(buf, "offload_to_cpu"):
                            buf.offload_to_cpu()
