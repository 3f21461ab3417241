"""Whether a model chunk is CUDA-graphed: TE's marks and Megatron's switches and marks.

A captured CUDA graph keeps the addresses of TE's workspaces: freed, a replay touches memory that now
belongs to someone else, so a chunk with graphs on is never cleared. Both TE (`make_graphed_callables`)
and Megatron (its config switches, its graph holders) say "this chunk is graphed"; the walk over a
chunk notices the module marks on its way (`MEGATRON_GRAPH_SUBMODULE`, `MEGATRON_GRAPH_LIST`, `te_graph_mark`), and
`cuda_graph_reason` adds what the chunk's config says. Attribute names only: nothing is imported.
`private_pools` says what the process as a whole holds in graph pools (read from the allocator).
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

# Megatron's TransformerConfig switches for CUDA graphs (megatron/core/transformer/transformer_config.py).
MEGATRON_CONFIG_FLAGS = ("enable_cuda_graph", "external_cuda_graph")
# Megatron's module markers (megatron/core/transformer/module.py, core_v0.15+; transformer_layer.py
# before): a `cudagraph_manager` submodule for cuda_graph_impl="local", a `cuda_graphs` list that
# TECudaGraphHelper fills for "transformer_engine".
MEGATRON_GRAPH_SUBMODULE = "cudagraph_manager"
MEGATRON_GRAPH_LIST = "cuda_graphs"

# TE's own marks (transformer_engine/pytorch/graph.py, 1.9 - 2.20; checked against each release's
# graph.py by tests/hostile/test_te_cuda_graphs.py):
# `make_graphed_callables(module, ...)` sets instance attributes that are functions of that module:
# `forward` = `_make_graphed_callables.<locals>.make_graphed_forward.<locals>.new_fwd` (without `_order`),
# before 2.8 also `forward` = `make_graphed_callables.<locals>.wrap_autocast.<locals>.forward_func`
# (left in place even with `_order`), and from 2.10 `reset` / `backward_dw`. Recognised by the
# function's module, so a renamed closure in a later release is still caught.
TE_GRAPH_MODULE = "transformer_engine.pytorch.graph"
TE_GRAPH_ATTRS = ("forward", "reset", "backward_dw")


def te_graph_mark(module: Any) -> str | None:
    """What TE's `make_graphed_callables` left on `module` (an instance attribute that is a function
    of TE's graph module), or None."""
    d = getattr(module, "__dict__", None) or {}
    for name in TE_GRAPH_ATTRS:
        value = d.get(name)
        # TE's marks are plain functions, whose `__module__` is a field: anything else under that
        # name (a lazy proxy would run its factory at the attribute read) is not read further.
        if type(value) is not FunctionType or value.__module__ != TE_GRAPH_MODULE:
            continue
        function = str(value.__qualname__).rsplit(".", 1)[-1]
        return f"{type(module).__name__}.{name} is TE's {function} from make_graphed_callables"
    return None


def cuda_graph_reason(chunk: Any, graph_mark: str | None = None) -> str | None:
    """Why clearing this chunk would be unsafe because of CUDA graphs, or None.

    `graph_mark` is what the walk over the chunk found (a module mark); Megatron's config says
    whether graphs are on, for the chunk and every wrapper around its module."""
    obj, depth = chunk, 0
    while obj is not None and depth < 8:
        config = obj.__dict__.get("config") if hasattr(obj, "__dict__") else None
        if config is not None:
            impl = getattr(config, "cuda_graph_impl", None)
            if impl not in (None, "none"):
                return f"config.cuda_graph_impl={impl!r}"
            for flag in MEGATRON_CONFIG_FLAGS:
                if getattr(config, flag, False) is True:
                    return f"config.{flag}=True"
        obj = obj.__dict__.get("_modules", {}).get("module") if hasattr(obj, "__dict__") else None
        depth += 1
    return graph_mark


def private_pools(torch: Any) -> dict[str, int]:
    """Per CUDA device, the bytes reserved in segments of private pools: those of captured CUDA graphs
    (TE's `make_graphed_callables`, Megatron's, `torch.compile`'s) and of MemPools (TE's symmetric-memory
    pool among them), read from the allocator's snapshot (`torch.cuda.memory_snapshot()`: every
    segment whose `segment_pool_id` is not the default pool's `(0, 0)`). Which graph holds which pool
    cannot be read: the process keeps no registry of its graphs. Empty while CUDA is not initialised."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    try:  # without the frames memory-history recording adds to every block, where this torch takes it
        segments = cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = cuda.memory_snapshot()
    found: dict[str, int] = {}
    for segment in segments:
        pool = tuple(segment.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            device = f"cuda:{segment['device']}"
            found[device] = found.get(device, 0) + int(segment["total_size"])
    return found
