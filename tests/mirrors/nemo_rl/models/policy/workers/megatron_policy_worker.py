"""Mirror of NeMo-RL's Megatron policy worker, 0.6.0+ layout.

Upstream: NVIDIA-NeMo/RL, nemo_rl/models/policy/workers/megatron_policy_worker.py at 7ea279ab
(HEAD 2026-08-22; same layout from v0.6.0 5fb58893, split by f00e1006 "#2094"). Re-writes only the
lines that matter to the shim: the `MegatronPolicyWorkerImpl` class with `offload_before_refit(self)`
(l.3073) and `offload_after_refit(self)` (l.3172, which calls the former through `self.`), `move_model`
reaching each DDP buffer's `offload_to_cpu` (l.3195-3230), the opt-in `_clear_fp8_caches` behind
`fp8_cfg.force_clear_fp8_caches` (l.3049-3101, flag from 04fc1377 "#2670", first in v0.7.0), and the
`@ray.remote` subclass `MegatronPolicyWorker(MegatronPolicyWorkerImpl): pass` (l.3683).
`self.model` is one megatron DDP (nemo_rl/models/megatron/setup.py l.1948: `model = model[0]`).
`torch.cuda.empty_cache()` is replaced by a recorder; optimizer, NVTX and stats lines are left out.
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush
import ray
import torch


class MegatronPolicyWorkerImpl:
    def __init__(self, model: Any, config: dict) -> None:
        # upstream builds the model from `config`; the mirror is handed a built megatron DDP
        self.cfg = config
        self.model = model
        self.fp8_cfg = config["megatron_cfg"].get("fp8_cfg", None)

    def _clear_fp8_caches(self) -> None:
        for module in self.model.modules():
            if hasattr(module, "_fp8_workspaces"):
                module._fp8_workspaces.clear()

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
        if self.fp8_cfg and self.fp8_cfg.get("force_clear_fp8_caches", False):
            self._clear_fp8_caches()
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


@ray.remote(num_gpus=0)
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    pass
