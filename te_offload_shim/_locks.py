"""The package's locks: a forked child can always take them, and a signal handler can neither leave
one held nor wait on one its own thread holds.

- Fork: `os.fork()` copies a lock in whatever state it is: held by a thread that does not exist in
  the child, it is held forever, and the child hangs at its next offload or import. Every lock of
  the package is made here, and each is re-initialised in place in the child (`_at_fork_reinit`,
  as CPython's threading does for its own), so a module that holds it under two names keeps one
  lock. Whatever it guarded may be half-updated in the child; every guarded structure tolerates
  that (a registry entry is recorded before it takes effect).
- Signals: CPython runs a Python signal handler between bytecodes of the main thread, so inside
  any `__enter__` / `__exit__` written in Python: a handler's exception there (Ctrl-C, a SIGTERM
  handler's SystemExit, a timeout) leaves the lock held for good. A lock made here is the raw
  `_thread` lock itself, which a `with` statement takes and releases in C, with no handler able to
  run between the acquire and the block's protection (tests/hostile/test_signals.py checks it on
  every Python the package supports). It is re-entrant: a handler that runs while its thread holds
  one and calls back into the package (an offload on a preemption notice, `stats()` from a
  "dump" handler) must not wait forever on its own thread. The offload path does not even take it
  again: `held_here()` tells it that it interrupted the package, and it runs the original alone.

The start-up module (`__init__`) is not allowed the cost of importing this one: its one lock, the
import hook's, is a raw `_thread` lock too, and a fork waits for it instead (it guards loads of the
shim's own modules, which a child must never get half done).
"""

from __future__ import annotations

import _thread
import os

from te_offload_shim._reload import kept

# Every lock made, kept by a reload of this module (`kept`): the locks made before it (the registry's,
# kept; those of modules not reloaded) are still re-initialised in a forked child and seen by `held_here`.
_all: list[_thread.RLock] = kept(globals(), "_all", list)


def Lock() -> _thread.RLock:  # named as what it makes, as `threading.Lock` is
    """A new lock of the package: re-entrant, entered and exited in C, re-initialised in a forked child."""
    lock = _thread.RLock()
    _all.append(lock)
    return lock


def held_here() -> bool:
    """Whether this thread holds a lock of the package: code that runs now interrupted the package
    (a signal handler, a `__del__` run by the collector) and must not touch its state."""
    return any(lock._is_owned() for lock in _all)  # type: ignore[attr-defined]


def _after_fork_in_child() -> None:
    for lock in _all:
        lock._at_fork_reinit()  # type: ignore[attr-defined]


if hasattr(os, "register_at_fork"):  # POSIX only; a reload registers again (re-initialising twice is harmless)
    os.register_at_fork(after_in_child=_after_fork_in_child)
