"""Mirror of megatron-core 0.17 - 0.19 (a root of its own: the same package path as the real
megatron-core 0.16.1 in the venv). Only `megatron.core.distributed`'s DDP and its buffers, and
`package_info`; which release it is comes from MEGATRON_CORE_MIRROR_RELEASE (package_info.py)."""
