"""The flush net's data: what it wraps (the allocator flush every offload ends with) and where TE's
layers come from (TE's base module class), and the watch table's callback that arms it when TE's
PyTorch modules are imported. The patching itself is the engine's (engine/net.py).
"""

from __future__ import annotations

import sys
from types import ModuleType

from te_offload_shim._hook import finished
from te_offload_shim.engine import net
from te_offload_shim.te import placement

# TE's base class of every layer with weights (transformer_engine/pytorch/module/base.py, 1.x - 2.20):
# the start-up watches its module (transformer_engine.pytorch.module.base), so the net arms right after
# its body runs, before any layer exists.
TE_BASE_CLASS = "TransformerEngineBaseModule"
TE_PACKAGE = "transformer_engine.pytorch"
# The allocator flush, where torch defines it and where torch.cuda re-exports it (`from .memory import *`).
FLUSHES = (("torch.cuda", "empty_cache"), ("torch.cuda.memory", "empty_cache"))

# What the sharding wrappers used with TE leave on every parameter they manage, handed down to
# te/placement.py: such a parameter is never taken for offloaded, wherever its data is (between
# microbatches a reshard frees it; TE's cache must stay). Types by name: torch's DTensor (FSDP2's
# `fully_shard`, torchtitan; torch/distributed/tensor). Attributes (present, whatever the value):
# FSDP1's `_fsdp_flattened` (torch/distributed/fsdp/_common_utils.py `_set_fsdp_flattened`, on each
# original parameter and the flat one; TE's `prepare_te_modules_for_fsdp`), Megatron-FSDP's
# `__fsdp_param__` (megatron-core 0.14+ megatron_fsdp.py), DeepSpeed ZeRO-3's `ds_id` (deepspeed
# 0.19.8 runtime/zero/partition_parameters.py `_convert_to_deepspeed_param`, beside `ds_status`,
# `ds_shape`, `ds_tensor`; `free_param` swaps an empty tensor on the device after each use).
SHARDED_TYPES = ("DTensor",)
SHARDED_MARKS = ("_fsdp_flattened", "__fsdp_param__", "ds_id")
# An offload that swaps a parameter for an empty tensor still on the device looks like a reshard;
# the net clears it only where the offload marks the parameter: SkyRL's LoRA offload keeps the CPU
# copy in `param._offload_cpu_data` (skyrl/backends/skyrl_train/distributed/megatron/megatron_utils.py,
# `offload_megatron_model_to_cpu(models, is_lora=True)`; tests/mirrors/forks/skyrl_megatron_utils.py).
OFFLOAD_MARKS = ("_offload_cpu_data",)


def on_te_import(module: ModuleType) -> None:
    """The start-up's callback for TE's base module: arm the net."""
    placement.know(SHARDED_TYPES, SHARDED_MARKS, OFFLOAD_MARKS)
    # Only where TE's package has finished importing can layers have been built already (the
    # callback also runs at install() when the shim is imported after TE).
    net.arm(module, TE_BASE_CLASS, FLUSHES, te_ready=finished(sys.modules.get(TE_PACKAGE)))
