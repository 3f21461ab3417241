"""megatron/core/distributed/__init__.py: exports the DDP class and its config (l.8-9 at core_v0.19.0)."""

from .distributed_data_parallel import DistributedDataParallel
from .distributed_data_parallel_config import DistributedDataParallelConfig

__all__ = ["DistributedDataParallel", "DistributedDataParallelConfig"]
