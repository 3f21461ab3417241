"""Mirror of NeMo-RL's Megatron policy worker at the head of open PR #2248 (a root of its own: the
same module path as the 0.6+ mirror).

Upstream: NVIDIA-NeMo/RL, nemo_rl/models/policy/workers/megatron_policy_worker.py at f45ee06b
(refs/pull/2248/head, 2026-07-13, on main 1412a29f). What the PR changes for the shim: the optional
cache clearing moves into `_clear_refit_memory_caches(self)` (l.2003; the FP8 part still behind
`fp8_cfg.force_clear_fp8_caches`, `_clear_fp8_caches` l.1979), and `offload_after_refit(self)`
(l.2102) no longer calls `offload_before_refit` (l.2067): it moves the model (`move_model(self.model,
"cpu")`, l.2130, each DDP buffer's `offload_to_cpu`), calls `_clear_refit_memory_caches()`, offloads
the optimizer, then `gc.collect()` and `torch.cuda.empty_cache()` itself. `MegatronPolicyWorker`
is still the `@ray.remote` subclass (l.2673). Re-writes only those lines: the flush is a recorder;
the optimizer, rotary-cache and MoE-dispatcher clearing, memory prints and NVTX are left out.
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

    def _clear_refit_memory_caches(self) -> None:
        # shared by both offloads in the PR; the rotary-embedding and dispatcher parts are left out
        if self.fp8_cfg and self.fp8_cfg.get("force_clear_fp8_caches", False):
            self._clear_fp8_caches()

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
        self._clear_refit_memory_caches()
        gc.collect()
        mirror_flush.empty_cache(self.model)  # upstream: torch.cuda.empty_cache()
        no_grad.__exit__(None, None, None)

    def offload_after_refit(self) -> None:
        no_grad = torch.no_grad()
        no_grad.__enter__()
        self.model = self.move_model(self.model, "cpu")
        self.model.eval()
        self._clear_refit_memory_caches()
        gc.collect()
        mirror_flush.empty_cache(self.model)  # upstream: torch.cuda.empty_cache(), no offload_before_refit
        no_grad.__exit__(None, None, None)


@ray.remote(num_gpus=0)
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    pass
