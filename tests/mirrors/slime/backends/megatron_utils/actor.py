"""Mirror of slime's Megatron training actor.

Upstream: THUDM/slime, slime/backends/megatron_utils/actor.py at 624b824a (HEAD 2026-08-21; `sleep`
l.206, present from v0.2.1 0934a0e2 to v0.3.1 a6272da0). Re-writes only the lines that matter:
`MegatronTrainRayActor.sleep(self) -> None` with its `assert self.args.offload_train`, `self.model` as
the list of DDP chunks from `initialize_model_and_optimizer`, and `clear_memory(clear_host_memory=True)`
at its start / `torch_memory_saver.pause()` replaced by recorders. The class is made a Ray actor by
its caller (`ray.remote(...)(MegatronTrainRayActor)`), not decorated in the module.
"""

from __future__ import annotations

from typing import Any

import mirror_flush


class MegatronTrainRayActor:
    def __init__(self, args: Any, models: list[Any]) -> None:
        self.args = args
        self.model = models

    def sleep(self) -> None:
        assert self.args.offload_train
        mirror_flush.empty_cache(self.model)  # upstream: clear_memory(clear_host_memory=True)
        mirror_flush.pause(self.model)  # upstream: torch_memory_saver.pause()
