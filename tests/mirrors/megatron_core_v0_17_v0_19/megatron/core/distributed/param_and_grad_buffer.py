"""Mirror of megatron/core/distributed/param_and_grad_buffer.py, `_ParamAndGradBuffer`, at NVIDIA/Megatron-LM
core_v0.17.0 (9539a12e, class l.761), core_v0.18.0 (ba7b5ebc, l.940) and core_v0.19.0 (5be96267, l.998).

Re-writes only what the shim and its residue report meet:
- the buffer is built from `(param, name)` pairs and keeps `self.params` as the list of the parameters
  (0.17 on; 0.16.1 was handed the list itself);
- `param_data` (with the distributed optimizer) and `grad_data` are one flat allocation each; every
  `param.data` becomes a view into `param_data` (values copied in) and every `param.main_grad` a view into
  `grad_data`;
- 0.17 on: a parameter whose name matches `param_name_patterns_for_fp32_local_accumulation` keeps the grad
  buffer's view as `main_grad_copy_in_grad_buffer` and gets an FP32 `main_grad` of its own, appended to
  `self.extra_main_grads` (l.1010-1064 at core_v0.17.0);
- `offload_to_cpu(move_params=True, move_grads=True)` and `reload_from_cpu(...)`: the same text in every tag
  from core_v0.16.1 to core_v0.19.0 (l.1204 / l.1479 / l.1619): the grad storage resized to 0, the params
  copied to a (pinned) CPU copy and their storage resized to 0; reload resizes back, copies back, zeroes
  the grads. Neither touches `extra_main_grads`, which stay where they are.
Buckets, bucket groups, communication and layouts are left out; the device is the parameters' own
(upstream: `torch.cuda.current_device()`), and pinning is left to the harness's CPU quirks.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch


class _ParamAndGradBuffer:
    def __init__(
        self,
        ddp_config: Any,
        param_dtype: torch.dtype,
        grad_dtype: torch.dtype,
        params_with_names: list[tuple[torch.nn.Parameter, str]],
    ) -> None:
        self.ddp_config = ddp_config
        self.params = [param for (param, _) in params_with_names]
        self.numel = sum(p.data.nelement() for p in self.params)
        device = self.params[0].device
        self.param_data = None
        self.grad_data = None
        self.extra_main_grads: list[torch.Tensor] = []
        if ddp_config.use_distributed_optimizer:
            self.param_data = torch.zeros(self.numel, dtype=param_dtype, device=device)
        self.grad_data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        self.grad_data_size = 0
        self.param_data_size = 0
        self.param_data_cpu = None

        start = 0
        for param, name in params_with_names:
            end = start + param.data.nelement()
            if self.param_data is not None:
                old = param.data
                param.data = self.param_data[start:end].view(old.shape)
                param.data.detach().copy_(old)
            param.main_grad = self.grad_data[start:end].view(param.data.shape)
            patterns = ddp_config.param_name_patterns_for_fp32_local_accumulation
            if any(pattern == "all" or fnmatch.fnmatch(name, pattern) for pattern in patterns):
                param.main_grad_copy_in_grad_buffer = param.main_grad
                param.main_grad = torch.empty_like(param.main_grad, dtype=torch.float32)
                self.extra_main_grads.append(param.main_grad)
            start = end

    def offload_to_cpu(self, move_params: bool = True, move_grads: bool = True) -> None:
        if move_grads and self.grad_data is not None and self.grad_data.storage().size() > 0:
            self.grad_data_size = self.grad_data.storage().size()
            self.grad_data.storage().resize_(0)
        if move_params and self.param_data is not None and self.param_data.storage().size() > 0:
            self.param_data_size = self.param_data.storage().size()
            if self.param_data_cpu is not None:
                self.param_data_cpu.copy_(self.param_data, non_blocking=True)
            else:
                self.param_data_cpu = self.param_data.cpu().pin_memory()
            self.param_data.storage().resize_(0)

    def reload_from_cpu(self, move_params: bool = True, move_grads: bool = True) -> None:
        if (
            move_params
            and self.param_data is not None
            and self.param_data_cpu is not None
            and self.param_data.storage().size() == 0
        ):
            self.param_data.storage().resize_(self.param_data_size)
            self.param_data.copy_(self.param_data_cpu, non_blocking=True)
        if move_grads and self.grad_data is not None and self.grad_data_size > 0:
            self.grad_data.storage().resize_(self.grad_data_size)
            self.grad_data.zero_()
            self.grad_data_size = 0
