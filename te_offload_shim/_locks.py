"""Locks that a forked child can always take.

`os.fork()` copies a lock in whatever state it is: held by a thread that does not exist in the
child, it is held forever, and the child hangs at its next offload or import. Every lock of the
package is made here, and each is replaced by a fresh one in the child (the same thing CPython
does for its own import and logging locks). Whatever that lock guarded may be half-updated in the
child; every guarded structure tolerates that (a registry entry is recorded before it takes effect).
The start-up module (`__init__`) is not allowed the cost of importing this one: it resets its own
locks the same way.
"""

from __future__ import annotations

import _thread
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_all: list[Lock] = globals().get("_all", [])  # kept by importlib.reload: the locks made before it are reset too


class Lock:
    """A context-manager lock (re-entrant if asked) that is reset in a forked child."""

    __slots__ = ("_factory", "_lock")

    def __init__(self, reentrant: bool = False) -> None:
        self._factory: Callable[[], Any] = _thread.RLock if reentrant else _thread.allocate_lock
        self._lock = self._factory()
        _all.append(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)


def _after_fork_in_child() -> None:
    for lock in _all:
        lock._lock = lock._factory()


if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
