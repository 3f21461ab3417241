"""Mirror of NeMo-RL's Megatron policy worker, 0.5.x layout (a root of its own: same module path as 0.6+).

Upstream: NVIDIA-NeMo/RL, nemo_rl/models/policy/workers/megatron_policy_worker.py at v0.5.0 6c708930
(moved here by a99bc262 "#1585"; the Impl split came later, f00e1006, v0.6.0). Re-writes only the lines
that matter: `@ray.remote(...) class MegatronPolicyWorker(...)` holding `offload_before_refit(self)`
itself, `self.model` as one DDP, `move_model` into each DDP buffer's `offload_to_cpu`, the flush at its
end replaced by a recorder. No fp8 flag in 0.5 (added in 0.7.0).
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush
import ray
import torch


@ray.remote(num_gpus=0)
class MegatronPolicyWorker:
    def __init__(self, model: Any, config: dict) -> None:
        self.cfg = config
        self.model = model

    def move_model(self, model: Any, device: str, move_params: bool = True, move_grads: bool = True) -> Any:
        for buffers in [model.buffers, model.expert_parallel_buffers]:
            for buffer_idx in range(len(buffers)):
                if device == "cpu":
                    buffers[buffer_idx].offload_to_cpu(move_params=move_params, move_grads=move_grads)
                else:
                    buffers[buffer_idx].reload_from_cpu(move_params=move_params, move_grads=move_grads)
        return model

    def offload_before_refit(self) -> None:
        no_grad = torch.no_grad()
        no_grad.__enter__()
        self.model = self.move_model(self.model, "cpu", move_params=False, move_grads=True)
        gc.collect()
        mirror_flush.empty_cache(self.model)  # upstream: torch.cuda.empty_cache()
        no_grad.__exit__(None, None, None)

    def offload_after_refit(self) -> None:
        no_grad = torch.no_grad()
        no_grad.__enter__()
        self.model = self.move_model(self.model, "cpu")
        self.model.eval()
        self.offload_before_refit()
        no_grad.__exit__(None, None, None)
