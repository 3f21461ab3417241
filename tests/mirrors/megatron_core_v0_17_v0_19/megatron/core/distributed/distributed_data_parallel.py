"""Mirror of megatron/core/distributed/distributed_data_parallel.py, `DistributedDataParallel`, at NVIDIA/Megatron-LM
core_v0.17.0 (9539a12e), core_v0.18.0 (ba7b5ebc) and core_v0.19.0 (5be96267).

Re-writes only what the shim's owner search and the frameworks' offloads meet: `self.module`; the trainable
parameters split by their `allreduce` attribute (False: expert-parallel); one `_ParamAndGradBuffer` per
dtype for each group, held in `self.buffers` and `self.expert_parallel_buffers`, the two lists the
owner search reads. How the lists are filled differs by tag, and the mirror follows each:
- core_v0.17.0 (l.294-299): `self.buffers, self.bucket_groups = _allocate_buffers_for_parameters(...)`,
  once for the dense and once for the expert-parallel parameters, each list assigned whole;
- core_v0.18.0 (l.207-257) and core_v0.19.0 (l.216-266): both lists set to `[]` first, then one buffer
  per (param dtype, grad dtype, is expert parallel) key appended to one of them
  (`group_params_for_buffers`), the constructor also taking `full_param_layout`.
`offload_grad_buffers` calls each buffer's `offload_to_cpu(move_params=False, move_grads=True)` (l.608 /
l.615 / l.652). Process groups, bucketing, hooks, communication and layouts are left out.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron.core import package_info

from .param_and_grad_buffer import _ParamAndGradBuffer


class DistributedDataParallel(torch.nn.Module):
    def __init__(
        self,
        config: Any,
        ddp_config: Any,
        module: torch.nn.Module,
        disable_bucketing: bool = False,
        pg_collection: Any = None,
        full_param_layout: Any = None,
    ) -> None:
        if package_info.TAG == "0.17.0" and full_param_layout is not None:
            raise TypeError("full_param_layout is new in core_v0.18.0")
        super().__init__()
        self.config = config
        self.ddp_config = ddp_config
        self.module = module
        dense, expert = [], []
        for name, param in self.module.named_parameters():
            if not param.requires_grad:
                continue
            (dense if getattr(param, "allreduce", True) else expert).append((param, name))

        grad_dtype_of = (lambda p: torch.float32) if ddp_config.grad_reduce_in_fp32 else (lambda p: p.dtype)
        if package_info.TAG == "0.17.0":

            def allocate(params: list) -> tuple[list, list]:
                by_dtype: dict[tuple, list] = {}
                for param, name in params:
                    by_dtype.setdefault((param.dtype, grad_dtype_of(param)), []).append((param, name))
                buffers = [_ParamAndGradBuffer(ddp_config, p, g, group) for (p, g), group in by_dtype.items()]
                return buffers, []  # (buffers, bucket groups)

            self.buffers, self.bucket_groups = allocate(dense)
            self.expert_parallel_buffers, self.expert_parallel_bucket_groups = allocate(expert)
        else:
            groups: dict[tuple, list] = {}
            for is_expert, params in ((False, dense), (True, expert)):
                for param, name in params:
                    groups.setdefault((param.dtype, grad_dtype_of(param), is_expert), []).append((param, name))
            self.buffers = []
            self.expert_parallel_buffers = []
            for (param_dtype, grad_dtype, is_expert), params in groups.items():
                buffer = _ParamAndGradBuffer(ddp_config, param_dtype, grad_dtype, params)
                if is_expert:
                    self.expert_parallel_buffers.append(buffer)
                else:
                    self.buffers.append(buffer)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def offload_grad_buffers(self, synchronize: bool = True, empty_cache: bool = True) -> None:
        for buffer in self.buffers + self.expert_parallel_buffers:
            buffer.offload_to_cpu(move_params=False, move_grads=True)
