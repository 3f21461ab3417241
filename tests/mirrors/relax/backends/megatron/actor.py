"""Mirror of Relax's Megatron training actor.

Upstream: redai-infra/Relax, relax/backends/megatron/actor.py at f522784e (main, 2026; no release):
`MegatronTrainRayActor.sleep(self) -> None` asserts `self.args.offload_train`, calls
`clear_memory(clear_host_memory=True)`, tears down the process groups, then
`torch_memory_saver.pause()` when the saver is enabled. `self.model` is the list of DDP chunks from
`initialize_model_and_optimizer`. Why a mirror: Relax is not on PyPI and its actor imports
`transfer_queue`, `torch_memory_saver` and Megatron-LM's training package at its top. The flush and
the pause are recorders here.
"""

from __future__ import annotations

from typing import Any

import mirror_flush


class MegatronTrainRayActor:
    def __init__(self, args: Any, models: list[Any]) -> None:
        self.args = args
        self.model = models
        self._torch_memory_saver_enabled = True

    def sleep(self) -> None:
        assert self.args.offload_train
        mirror_flush.empty_cache(self.model)  # upstream: clear_memory(clear_host_memory=True)
        if self._torch_memory_saver_enabled:
            mirror_flush.pause(self.model)  # upstream: torch_memory_saver.pause()
