"""Megatron's DDP buffers: from a `_ParamAndGradBuffer` to the model whose TE layers keep weights in
it, for megatron-core's `_ParamAndGradBuffer.offload_to_cpu` target (integrations/rules.py loads this
module at that target's first call: verl and the other frameworks never call it, and never load it).

A buffer knows its parameters, not its modules. Its owner is a megatron `DistributedDataParallel`
(`ddp.buffers` / `ddp.expert_parallel_buffers`, `DDP_BUFFER_LISTS`). Owners are found once, at the
first offload of an unknown buffer, by one pass over the garbage collector's objects, then
remembered weakly: so it works for a DDP built before or after the shim was activated, and costs
nothing per training step. A buffer without an owner (none found, its DDP collected, or the search
itself failed) is remembered as such and never searched for again; a search that finds nothing or
fails raises, so that the handler says so once in the log and in `status` (the offload goes on).

`gc.freeze()` (vLLM's `freeze_gc_heap` after its warm-up, SGLang's `freeze_gc`, in the same process
as the trainer in colocated RL) moves every object to a permanent generation that
`gc.get_objects()` does not list, and `gc.get_referrers()` searches the same generations. With a
frozen heap, a pass that found nothing goes on from the roots: the modules (`sys.modules`), every
thread's stack (Python 3.13+), and the objects the collector lists, following `gc.get_referents`
(each object's own C traversal), until the buffer's DDP is found or nothing is left. So a DDP
reachable from a module or from an object made after the freeze is found; one held only by a
running function's local variables is found on 3.13+, and said not found before. The collector's
state (frozen, disabled) is read, never changed.

Both passes read nothing but each object's type: `isinstance` reads `obj.__class__` when the type
does not match, and the heap holds anything (a module loaded with `importlib.util.LazyLoader`
executes its body on any attribute read; a lazy proxy such as Django's `LazyObject` raises there).
`gc.get_referents` runs no Python code either.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

from te_offload_shim._locks import Lock
from te_offload_shim.integrations.megatron import DDP_BUFFER_LISTS

# What the searches found (a reload of this module searches again, once per buffer)
_owners: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()
_orphans: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = Lock()  # fork-safe, like every lock of the package
_DDP_MODULES = (
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed",
)


def _ddp_classes() -> tuple[type, ...]:
    found = {getattr(sys.modules.get(name), "DistributedDataParallel", None) for name in _DDP_MODULES}
    return tuple(cls for cls in found if isinstance(cls, type))


class OwnerSearchFailed(RuntimeError):
    """The pass over the heap for a buffer's DDP raised: that buffer is not searched for again."""


class OwnerNotFound(LookupError):
    """No megatron DDP holds the buffer: its offloads clear nothing (said once, and in `status`)."""


def _register_all(objects: list[Any], classes: tuple[type, ...]) -> None:
    """Remember the owner of the buffers of every DDP among `objects` (by type alone: see the
    module's docstring)."""
    kinds = {cls for cls in set(map(type, objects)) if issubclass(cls, classes)}
    if not kinds:
        return
    for obj in objects:
        if type(obj) in kinds:
            try:
                fields = obj.__dict__  # dense buffers first
                buffers = [buffer for name in DDP_BUFFER_LISTS for buffer in fields.get(name) or ()]
            except Exception:  # one DDP whose buffers cannot be read costs only itself
                continue
            with _lock:
                _owners.update(dict.fromkeys(buffers, weakref.ref(obj)))


def _scan() -> None:
    classes = _ddp_classes()
    if classes:
        _register_all(gc.get_objects(), classes)


# Objects asked for their referents at once, in the search from the roots: bounds the lists it makes.
_STEP = 10_000


def _search_from_roots(buffer: Any) -> None:
    """With a frozen heap: breadth first from the roots (see the module's docstring), registering
    every DDP on the way, until `buffer` has an owner. The objects the collector lists are the last
    roots: they are the young ones, the frozen heap is what is left to reach."""
    classes = _ddp_classes()
    if not classes:
        return
    get_referents, is_tracked = gc.get_referents, gc.is_tracked
    level: list[Any] = [sys.modules, *_stack_locals()]
    seen = set(map(id, level))
    young: list[Any] | None = None
    while level:
        _register_all(level, classes)
        if buffer in _owners:
            return
        found: list[Any] = []
        for i in range(0, len(level), _STEP):
            # untracked objects (atoms, and containers of atoms only) lead nowhere
            found += filter(is_tracked, get_referents(*level[i : i + _STEP]))
        level = _unseen(found, seen)
        del found
        if young is None and not level:  # all the roots reach is searched: now the young objects
            young = gc.get_objects()
            level = _unseen(young, seen)


def _stack_locals() -> list[Any]:
    """The local variables of every frame of every thread's stack, where reading them keeps nothing:
    a running frame's traversal leaves its locals out, and before 3.13 `frame.f_locals` stores a
    snapshot of them on the frame, which would keep whatever they hold now alive after the function
    rebinds them (an old batch, a loss and its autograd graph): there, nothing (see `owner_of`)."""
    if sys.version_info < (3, 13):
        return []
    values: list[Any] = []
    for frame in sys._current_frames().values():
        while frame is not None:
            values += frame.f_locals.values()  # 3.13+: a view of the frame's variables (PEP 667)
            frame = frame.f_back
    return values


def _unseen(objects: list[Any], seen: set[int]) -> list[Any]:
    """The objects of `objects` whose ids are not in `seen`, each once; their ids are added to it."""
    fresh = dict(zip(map(id, objects), objects, strict=True))
    new = fresh.keys() - seen
    seen |= new
    return [fresh[i] for i in new]


def owner_of(buffer: Any) -> Any:
    """The DDP that holds `buffer`; None for a buffer remembered as ownerless. Raises
    `OwnerNotFound` when the search finds none, `OwnerSearchFailed` when it fails.

    A buffer is built inside its DDP's `__init__`, so one that no DDP holds at its first offload
    never will (megatron-core builds `_ParamAndGradBuffer`s only there: a user's own), and one whose
    DDP is gone never will again: remember both, or every offload would search the whole heap again."""
    with _lock:
        searched = buffer in _orphans or buffer in _owners
    frozen = gc.get_freeze_count()
    try:
        if not searched:
            _scan()
        if not searched and frozen and buffer not in _owners:
            _search_from_roots(buffer)
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
        if owner is None:  # none found, or its DDP is gone: never searched for again
            _owners.pop(buffer, None)
            _orphans.add(buffer)
    if owner is None and not searched:
        where = f"the heap ({frozen} objects frozen by gc.freeze(), searched from the roots)" if frozen else "the heap"
        raise OwnerNotFound(
            f"no megatron DistributedDataParallel in {where} holds the offloaded {type(buffer).__name__}; "
            "that buffer is not searched for again, and its offloads clear nothing"
        )
    return owner


def modules_of_buffer(buffer: Any) -> tuple[Any, list[Any]]:
    """(model chunk to walk, parameters whose TE layers to clear) for one buffer."""
    ddp = owner_of(buffer)
    if ddp is None:
        return None, []
    return ddp, list(getattr(buffer, "params", None) or ())
