"""The three fields of `DistributedDataParallelConfig` the mirror reads (distributed_data_parallel_config.py,
a dataclass; `param_name_patterns_for_fp32_local_accumulation` l.62 at core_v0.17.0 9539a12e, l.69 at
core_v0.18.0 ba7b5ebc and core_v0.19.0 5be96267: fnmatch patterns, or 'all', of the parameters whose
`main_grad` is accumulated in an FP32 copy outside the grad buffer)."""

from dataclasses import dataclass


@dataclass
class DistributedDataParallelConfig:
    use_distributed_optimizer: bool = False
    grad_reduce_in_fp32: bool = False
    param_name_patterns_for_fp32_local_accumulation: tuple[str, ...] = ()
