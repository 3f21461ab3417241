"""The live TE layers of the process, as weak references: what the flush net looks into, with no
model argument to start from.

A layer is noted when it is built (the engine calls `note` from TE's base module class's
`__init__`) or made without `__init__` (a copy, an unpickled layer: from its `__setstate__`); layers
built before those hooks were in place are found once, by `find_existing`.
Nothing here keeps a layer alive: a reference dies with its layer and drops out of the set.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from te_offload_shim._reload import kept

# Kept by a reload of this module (`kept`): the layers the hooks in place noted are still live, and
# the search over the heap that finds those built before runs only once, when the net arms.
# id(layer) -> weak reference, in build order: a flush visits the layers in the order their objects
# lie in memory, which misses the CPU cache far less than hash order. Edited only by single dict
# operations, each atomic under the GIL, so a flush on one thread may read it while another builds a
# layer (`entries` copies it).
_refs: dict[int, _Ref] = kept(globals(), "_refs", dict)


class _Ref(weakref.ref):
    """A weak reference to one layer, with the name of the parameter the flush net looks at first
    (`probe`: the one it last found on the device; te/placement.offloaded_entries)."""

    __slots__ = ("key", "probe")
    key: int
    probe: str | None


def _gone(ref: _Ref, refs: dict[int, _Ref] = _refs) -> None:
    # `refs` bound at definition: a layer that dies at interpreter shutdown, after this module's
    # globals were cleared, still finds the dict (and says nothing on stderr)
    try:
        if refs.get(ref.key) is ref:
            del refs[ref.key]
    except Exception:
        pass


def note(layer: Any) -> None:
    """Keep a weak reference to `layer` (a TE layer being built); once per layer."""
    key = id(layer)
    known = _refs.get(key)
    if known is not None and known() is layer:
        return
    try:
        ref = _Ref(layer, _gone)
    except TypeError:  # a layer that cannot be weakly referenced is not kept at all
        return
    ref.key = key
    ref.probe = None
    _refs[key] = ref


def entries() -> list[_Ref]:
    """The weak references themselves, in build order (one list; a dead one answers None): what
    the flush net's check walks (it keeps its probe on each)."""
    return list(_refs.values())  # a copy: another thread may be adding to the dict


def count() -> int:
    return len(_refs)


def find_existing(base: type) -> tuple[int, int]:
    """Note every instance of `base` the cyclic collector can see; returns (found, objects it cannot
    see). Run once, when the net arms after TE's layers may already exist. Objects moved to the
    permanent generation by `gc.freeze()` (servers freeze their heap after start-up) are not in
    `gc.get_objects()`: they are counted, not searched (unfreezing would undo the application's
    choice, and the collector would then scan them at every collection)."""
    # the type itself: an object's own `__class__` is never read
    found = [obj for obj in gc.get_objects() if issubclass(type(obj), base)]
    for layer in found:
        note(layer)
    return len(found), gc.get_freeze_count()


def forget_all() -> None:
    """Drop every reference (for uninstall: a later install notes the layers built from then on,
    and finds the others again)."""
    _refs.clear()
