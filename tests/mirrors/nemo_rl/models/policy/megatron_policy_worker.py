"""Mirror of NeMo-RL's Megatron policy worker, 0.3.0 - 0.4.x layout.

Upstream: NVIDIA-NeMo/RL, nemo_rl/models/policy/megatron_policy_worker.py at v0.4.0 c751f811 (same
path at v0.3.0 b1c86a81, v0.3.1 27d0af94; moved to workers/ by a99bc262 "#1585", first in v0.5.0).
Re-writes only the lines that matter: the `@ray.remote` class `MegatronPolicyWorker` holding
`offload_before_refit(self)` itself, `self.model` as one DDP (v0.3.0 l.597 `self.model = self.model[0]`),
`move_model` into each DDP buffer's `offload_to_cpu` (v0.3.x reached it through its Megatron-LM fork),
and the flush at its end replaced by a recorder. There is no fp8 flag in these releases.
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
