"""Mirror of AReaL's current Megatron weight release for awex colocation.

Upstream: areal-project/AReaL, areal/engine/weight_update/awex/megatron.py at 92a6b112
(`class MegatronColocateBackend`, the backend `AwexMegatronAdapter` became a facade over; on main only,
in no release). No row of the target table watches this module: it is the proof of the allocator-flush
net (tests/twin/test_twin_net.py). Re-writes only the lines that matter:
- `release_memory(self, tags: list[str] | None = None)`: the `tags or ["optimizer", "weights"]`
  default, the released-tags bookkeeping, `_offload_model_weights()` for "weights", then
  `torch.cuda.synchronize()`, `gc.collect()`, `torch.cuda.empty_cache()` (torch's own flush here,
  not a recorder: the net sits there);
- `_offload_model_weights`: DDP chunks through each buffer's `offload_to_cpu()` (or, where the buffer
  has none, by hand: a pinned `cpu_data` copy, `param_data.storage().resize_(0)`, the grad buffer
  too); any other chunk: each CUDA parameter's data kept in `offloaded_weights` and replaced by
  `torch.empty(0, device="cpu")`;
- `resume_memory` / `_reload_model_weights` (`reload_from_cpu(move_grads=load_grad)`, or the storage
  resized back and copied; the plain chunks' parameters moved back to the engine's device), and
  `ensure_grad_buffers` (the grad buffers resized back and zeroed before the next backward: the
  buffer's `offload_to_cpu()` freed them too, and the reload leaves them out).
Left out: the optimizer states, the awex metadata and CUDA-IPC transfer.
"""

from __future__ import annotations

import gc
from typing import Any

import torch


class MegatronColocateBackend:
    def __init__(self, engine: Any) -> None:
        self._engine = engine  # upstream: a MegatronEngine (its `.model`, `.device`)
        self.offloaded_weights: dict[str, torch.Tensor] = {}
        self.released_tags: set[str] = set()

    def release_memory(self, tags: list[str] | None = None) -> None:
        tags = tags or ["optimizer", "weights"]
        tags_to_release = [tag for tag in tags if tag not in self.released_tags]
        if not tags_to_release:
            return
        if "optimizer" in tags_to_release:
            self.released_tags.add("optimizer")  # upstream: self._offload_optimizer_states()
        if "weights" in tags_to_release:
            self._offload_model_weights()
            self.released_tags.add("weights")
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()

    def resume_memory(self, tags: list[str] | None = None) -> None:
        tags = tags or ["optimizer", "weights"]
        tags_to_resume = [tag for tag in tags if tag in self.released_tags]
        if "weights" in tags_to_resume:
            self._reload_model_weights(load_grad=False)
            self.released_tags.discard("weights")
        if "optimizer" in tags_to_resume:
            self.released_tags.discard("optimizer")
        torch.cuda.synchronize()

    def _chunks(self) -> list[Any]:
        model = self._engine.model
        if model is None:
            return []
        return list(model) if isinstance(model, (list, tuple)) else [model]

    def _offload_model_weights(self) -> None:
        from megatron.core.distributed import DistributedDataParallel as DDP

        for chunk in self._chunks():
            if isinstance(chunk, DDP):
                for buffers in [chunk.buffers, chunk.expert_parallel_buffers]:
                    for buf in buffers:
                        if hasattr(buf, "offload_to_cpu"):
                            buf.offload_to_cpu()
                            continue
                        if buf.param_data.storage().size() > 0:
                            if not hasattr(buf.param_data, "cpu_data"):
                                buf.param_data.cpu_data = torch.zeros(
                                    buf.param_data.data.shape, dtype=buf.param_data.data.dtype,
                                    pin_memory=True, device="cpu",
                                )  # fmt: skip
                            buf.param_data.cpu_data.copy_(buf.param_data.data)
                            buf.param_data_size = buf.param_data.storage().size()
                            buf.param_data.storage().resize_(0)
                        if buf.grad_data.storage().size() > 0:
                            buf.grad_data_size = buf.grad_data.storage().size()
                            buf.grad_data.storage().resize_(0)
            else:
                for name, param in chunk.named_parameters():
                    if param.data.is_cuda:
                        self.offloaded_weights[name] = param.data.detach().to("cpu", non_blocking=True)
                        param.data = torch.empty(0, device="cpu")
        torch.cuda.synchronize()

    def _reload_model_weights(self, load_grad: bool = False) -> None:
        from megatron.core.distributed import DistributedDataParallel as DDP

        device = self._engine.device
        for chunk in self._chunks():
            if isinstance(chunk, DDP):
                for buffers in [chunk.buffers, chunk.expert_parallel_buffers]:
                    for buf in buffers:
                        if hasattr(buf, "reload_from_cpu"):
                            buf.reload_from_cpu(move_grads=load_grad)
                            continue
                        if buf.param_data.storage().size() == 0:
                            buf.param_data.storage().resize_(buf.param_data_size)
                        buf.param_data.copy_(buf.param_data.cpu_data, non_blocking=True)
            else:
                for name, param in chunk.named_parameters():
                    if name in self.offloaded_weights:
                        param.data = self.offloaded_weights[name].to(device, non_blocking=True)
        self.offloaded_weights.clear()
        torch.cuda.synchronize()

    def ensure_grad_buffers(self) -> None:
        from megatron.core.distributed import DistributedDataParallel as DDP

        for chunk in self._chunks():
            if isinstance(chunk, DDP):
                for buffers in [chunk.buffers, chunk.expert_parallel_buffers]:
                    for buf in buffers:
                        if hasattr(buf, "grad_data_size") and buf.grad_data.storage().size() == 0:
                            buf.grad_data.storage().resize_(buf.grad_data_size)
                            buf.grad_data.zero_()
        torch.cuda.synchronize()
