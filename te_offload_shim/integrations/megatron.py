"""Megatron's knowledge, as data: its marks of a CUDA-graphed chunk (`CUDA_GRAPHS`, handed down to te/
at every clearing: engine/attributes.py, api.py) and the lists its DDP keeps its buffers in
(`DDP_BUFFER_LISTS`). The search for the DDP that owns an offloaded buffer, which megatron-core's
buffer offload needs (and no other target), is integrations/megatron_ddp.py's, loaded at that
target's first call.
"""

from te_offload_shim.te.graphs import GraphMarks

# Megatron's marks of a CUDA-graphed chunk (te/graphs.py reads them; TE's own it knows itself):
# TransformerConfig's switches (megatron/core/transformer/transformer_config.py: `cuda_graph_impl`
# "local" / "transformer_engine", core_v0.15+ maps the older `enable_cuda_graph` / `external_cuda_graph`
# onto it), on the chunk or on the model its wrappers (DDP, Float16Module) keep as `module`; and its
# module marks (megatron/core/transformer/module.py, core_v0.15+; transformer_layer.py before): a
# `cudagraph_manager` submodule for cuda_graph_impl="local", a `cuda_graphs` list that
# TECudaGraphHelper fills for "transformer_engine".
CUDA_GRAPHS = GraphMarks(
    config="config",
    wrapped="module",
    switches=(
        ("cuda_graph_impl", (None, "none")),
        ("enable_cuda_graph", (None, False)),
        ("external_cuda_graph", (None, False)),
    ),
    submodule="cudagraph_manager",
    captured="cuda_graphs",
)
# megatron/core/distributed/distributed_data_parallel.py (core_v0.12 - 0.16): `self.buffers` holds
# the dense parameters' `_ParamAndGradBuffer`s, `self.expert_parallel_buffers` the expert-parallel
# ones (apart, with their own data-parallel group). reports/residue.py names the same lists.
DDP_BUFFER_LISTS = ("buffers", "expert_parallel_buffers")
