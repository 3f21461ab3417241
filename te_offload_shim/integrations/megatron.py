"""Megatron's DDP buffers: from a `_ParamAndGradBuffer` to the model whose TE layers keep weights in it.

(Megatron's CUDA-graph switches and marks are read with TE's in te/graphs.py: both only say whether
a chunk is graphed, which the clearing needs whatever the framework.)

A buffer knows its parameters, not its modules. Its owner is a megatron `DistributedDataParallel`
(`ddp.buffers` / `ddp.expert_parallel_buffers`). Owners are found once, at the first offload of an
unknown buffer, by one pass over the garbage collector's objects, then remembered weakly: so it
works for a DDP built before or after the shim was activated, and costs nothing per training step.
A buffer without an owner (none found, its DDP collected, or the search itself failed) is
remembered as such and never searched for again.

The pass reads nothing but each object's type: `isinstance` reads `obj.__class__` when the type
does not match, and the heap holds anything (a module loaded with `importlib.util.LazyLoader`
executes its body on any attribute read; a lazy proxy such as Django's `LazyObject` raises there).
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

from te_offload_shim._locks import Lock
from te_offload_shim.te.ddp_buffers import ddp_buffers

# Kept by importlib.reload of this module (a reloader that reloads every module of the package):
# the state below outlives it, or uninstall() and status() would lose what was patched.
_owners: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = globals().get("_owners", weakref.WeakKeyDictionary())
_orphans: weakref.WeakSet[Any] = globals().get("_orphans", weakref.WeakSet())
_lock = globals().get("_lock") or Lock()  # fork-safe, like every lock of the package
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
    return ddp_buffers(ddp.__dict__)


def register(ddp: Any) -> None:
    """Remember `ddp` as the owner of its buffers."""
    ref = weakref.ref(ddp)
    with _lock:
        for buffer in _buffers_of(ddp):
            _owners[buffer] = ref


class OwnerSearchFailed(RuntimeError):
    """The pass over the heap for a buffer's DDP raised: that buffer is not searched for again."""


def _scan() -> None:
    classes = _ddp_classes()
    if not classes:
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), classes):  # the type only: see the module's docstring
            try:
                register(obj)
            except Exception:  # one DDP whose buffers cannot be read costs only itself
                continue


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
    try:
        _scan()
    except Exception as exc:
        with _lock:
            _orphans.add(buffer)
        raise OwnerSearchFailed(
            f"searching the heap for the DDP that owns a buffer failed ({type(exc).__name__}: {exc}); "
            "that buffer is not searched for again, and its offloads clear nothing"
        ) from None
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
