"""The live TE layers of the process, as weak references: what the flush net looks into, with no
model argument to start from.

A layer is noted when it is built (the engine calls `note` from TE's base module class's
`__init__`); layers built before that hook was in place are found once, by `find_existing`.
Nothing here keeps a layer alive: a reference dies with its layer and drops out of the set.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

# Kept by importlib.reload of this module: the layers noted before it are still live.
# A set of weak references: a reference hashes and compares as its (live) layer, so a layer noted
# twice is held once. Edited only by set.add / set.discard, each atomic under the GIL, so a flush
# on one thread may read it while another thread builds a layer (`live` iterates a copy).
_refs: set[weakref.ref] = globals().get("_refs", set())


def _gone(ref: weakref.ref) -> None:
    _refs.discard(ref)


def note(layer: Any) -> None:
    """Keep a weak reference to `layer` (a TE layer being built)."""
    try:
        _refs.add(weakref.ref(layer, _gone))
    except TypeError:  # a layer that cannot be weakly referenced is not kept at all
        pass


def live() -> list[Any]:
    """The TE layers alive now (one list: O(layers) references, nothing else per call)."""
    found = []
    for ref in list(_refs):  # a copy: another thread may be adding to the set
        layer = ref()
        if layer is not None:
            found.append(layer)
    return found


def count() -> int:
    return len(_refs)


def find_existing(base: type) -> tuple[int, int]:
    """Note every instance of `base` the cyclic collector can see; returns (found, objects it cannot
    see). Run once, when the net arms after TE's layers may already exist. Objects moved to the
    permanent generation by `gc.freeze()` (servers freeze their heap after start-up) are not in
    `gc.get_objects()`: they are counted, not searched (unfreezing would undo the application's
    choice, and the collector would then scan them at every collection)."""
    found = 0
    for obj in gc.get_objects():
        if isinstance(obj, base):
            note(obj)
            found += 1
    return found, gc.get_freeze_count()


def forget_all() -> None:
    """Drop every reference (for uninstall: a later install notes the layers built from then on,
    and finds the others again)."""
    _refs.clear()
