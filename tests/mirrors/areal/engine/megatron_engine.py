"""Mirror of AReaL's Megatron engine offload.

Upstream: areal-project/AReaL, areal/engine/megatron_engine.py at cbff54d6 (HEAD 2026-08-22,
`MegatronEngine.offload(self) -> None` l.1551; path unchanged since v1.0.4 37d6c640, where the same
method is l.1076 without the awex branch and the grad-buffer branch, which came in v2.0.0 fee938ea).
Re-writes only the lines that matter: `self.model` as a `_MegatronModelList(list)` of DDP chunks
(l.289), the awex branch (`current_platform.clear_memory()` then
`self._awex_adapter.release_memory(tags=["optimizer", "weights"])`), the
`mcore_config.disable_grad_buffers_cpu_backup` branch into `DistributedDataParallel.offload_grad_buffers`,
and `current_platform.clear_memory()` / `torch_memory_saver.pause()` replaced by recorders. The real
module imports mbridge and megatron.bridge (which imports Transformer Engine) at its top, so it does
not import on a CPU-only machine.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import mirror_flush


class _MegatronModelList(list):
    pass


class MegatronEngine:
    def __init__(self, models: list[Any], disable_grad_buffers_cpu_backup: bool = False) -> None:
        self.model = _MegatronModelList(models)
        self.mcore_config = SimpleNamespace(disable_grad_buffers_cpu_backup=disable_grad_buffers_cpu_backup)
        self._awex_adapter: Any = None
        self.is_offload = False

    def offload(self) -> None:
        if self._awex_adapter is not None:
            mirror_flush.empty_cache(self.model)  # upstream: current_platform.clear_memory()
            self._awex_adapter.release_memory(tags=["optimizer", "weights"])
            self.is_offload = True
            return

        if self.mcore_config.disable_grad_buffers_cpu_backup:
            for m in self.model:
                m.offload_grad_buffers(synchronize=False, empty_cache=False)

        mirror_flush.empty_cache(self.model)  # upstream: current_platform.clear_memory()
        mirror_flush.pause(self.model)  # upstream: torch_memory_saver.pause()
        self.is_offload = True
