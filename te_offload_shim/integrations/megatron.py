"""Megatron knowledge: its CUDA-graph switches and marks, and its DDP buffers.

CUDA graphs. A captured graph keeps the addresses of TE's workspaces: freed, a replay touches
memory that now belongs to someone else, so a chunk with graphs on is never cleared.

DDP buffers: from a Megatron `_ParamAndGradBuffer` to the model whose TE layers keep weights in it.

A buffer knows its parameters, not its modules. Its owner is a megatron `DistributedDataParallel`
(`ddp.buffers` / `ddp.expert_parallel_buffers`). Owners are found once, at the first offload of an
unknown buffer, by one pass over the garbage collector's objects, then remembered weakly: so it
works for a DDP built before or after the shim was activated, and costs nothing per training step.
A buffer without an owner (none found, or its DDP collected) is remembered as such and never
searched for again.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

from te_offload_shim._locks import Lock

# Megatron's TransformerConfig switches for CUDA graphs (megatron/core/transformer/transformer_config.py).
GRAPH_CONFIG_FLAGS = ("enable_cuda_graph", "external_cuda_graph")
# Megatron's module markers (megatron/core/transformer/module.py, core_v0.15+; transformer_layer.py
# before): a `cudagraph_manager` submodule for cuda_graph_impl="local", a `cuda_graphs` list that
# TECudaGraphHelper fills for "transformer_engine".
GRAPH_SUBMODULE = "cudagraph_manager"
GRAPH_LIST = "cuda_graphs"


def cuda_graph_reason(chunk: Any, graph_mark: str | None = None) -> str | None:
    """Why clearing this chunk would be unsafe because of CUDA graphs, or None.

    A captured graph keeps the workspace addresses; freed, replay touches memory that now belongs to
    someone else. Megatron's config says whether graphs are on, for the chunk and every wrapper."""
    obj, depth = chunk, 0
    while obj is not None and depth < 8:
        config = obj.__dict__.get("config") if hasattr(obj, "__dict__") else None
        if config is not None:
            impl = getattr(config, "cuda_graph_impl", None)
            if impl not in (None, "none"):
                return f"config.cuda_graph_impl={impl!r}"
            for flag in GRAPH_CONFIG_FLAGS:
                if getattr(config, flag, False) is True:
                    return f"config.{flag}=True"
        obj = obj.__dict__.get("_modules", {}).get("module") if hasattr(obj, "__dict__") else None
        depth += 1
    return graph_mark


_owners: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()
_orphans: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = Lock()  # fork-safe, like every lock of the package
_DDP_MODULES = (
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed",
)


def _ddp_classes() -> tuple[type, ...]:
    found = []
    for name in _DDP_MODULES:
        cls = getattr(sys.modules.get(name), "DistributedDataParallel", None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def _buffers_of(ddp: Any) -> list[Any]:
    d = ddp.__dict__
    return [*(d.get("buffers") or ()), *(d.get("expert_parallel_buffers") or ())]


def register(ddp: Any) -> None:
    """Remember `ddp` as the owner of its buffers."""
    ref = weakref.ref(ddp)
    with _lock:
        for buffer in _buffers_of(ddp):
            _owners[buffer] = ref


def _scan() -> None:
    classes = _ddp_classes()
    if not classes:
        return
    for obj in gc.get_objects():
        if isinstance(obj, classes):
            register(obj)


def owner_of(buffer: Any) -> Any:
    """The DDP that holds `buffer`, or None.

    A buffer is built inside its DDP's `__init__`, so one that no DDP holds at its first offload
    never will (Megatron-FSDP, a user's own), and one whose DDP is gone never will again: remember
    both, or every offload would scan the whole heap again."""
    with _lock:
        if buffer in _orphans:
            return None
        ref = _owners.get(buffer)
        if ref is not None:
            owner = ref()
            if owner is None:
                del _owners[buffer]
                _orphans.add(buffer)
            return owner
    _scan()
    with _lock:
        ref = _owners.get(buffer)
        owner = ref() if ref is not None else None
        if owner is None:
            _owners.pop(buffer, None)
            _orphans.add(buffer)
    return owner


def modules_of_buffer(buffer: Any) -> tuple[Any, list[Any]]:
    """(model chunk to walk, parameters whose TE layers to clear) for one buffer."""
    ddp = owner_of(buffer)
    if ddp is None:
        return None, []
    return ddp, list(getattr(buffer, "params", None) or ())
