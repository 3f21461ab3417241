"""The fresh interpreter of the smoke test of signals: on this Python, a `with` on a lock of the
package is never left held by a signal handler's exception (CPython enters and exits the raw lock in
C; bpo-29988 is about the window between), and 10,000 offloads interrupted at random points by
KeyboardInterrupts leave every lock of the package free. Prints one JSON line.

    python tests/smoke/signal_probe.py
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import threading
import time
from typing import Any

OFFLOADS = 10_000


def main() -> None:
    faulthandler.dump_traceback_later(50, exit=True)  # a hang ends the probe with its traceback
    import smoke_target

    import te_offload_shim as shim
    from te_offload_shim import _locks

    armed = [False]

    def interrupt(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    lock, counter = _locks.Lock(), [0]

    def locked_step() -> None:
        with lock:
            counter[0] += 1
            len(counter)

    lock_left_held = _interrupted(locked_step, armed, 1e-5, lambda: lock._is_owned())  # type: ignore[attr-defined]
    smoke_target.offload([])
    started = time.perf_counter()
    smoke_target.offload([])
    span = time.perf_counter() - started
    interrupts = _interrupted(lambda: smoke_target.offload([]), armed, span, lambda: False)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    held = [name for name, lock in _package_locks() if not _free(lock)]
    print(json.dumps({
        "python": list(sys.version_info[:2]),
        "lock_left_held": lock_left_held,
        "interrupts": interrupts,
        "held": held,
        "calls": shim.stats()["calls"],
    }))  # fmt: skip


def _interrupted(step: Any, armed: list[bool], span: float, held: Any) -> Any:
    """Run `step` OFFLOADS times, KeyboardInterrupts landing at random points of it; returns how
    many landed, or "held after N" the first time `held()` says a lock was left held."""
    rng = random.Random(27)
    done, hits = [0], 0
    try:
        while done[0] < OFFLOADS:
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0, 2 * span) + 1e-6)
                _steps(step, done)
                armed[0] = False  # done: the next interrupt must not land outside the `try`
            except KeyboardInterrupt:
                hits += 1
                done[0] += 1
            if held():
                return f"held after {hits}"
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    return hits


def _steps(step: Any, done: list[int]) -> None:
    # Its own frame: on CPython 3.11 - 3.13 an exception raised by a signal handler at a loop's
    # back-edge can miss the `try` of the same frame (python/cpython#108214, #130279).
    while done[0] < OFFLOADS:
        step()
        done[0] += 1


def _package_locks() -> list[tuple[str, Any]]:
    found = []
    for name, module in list(sys.modules.items()):
        lock = vars(module).get("_lock") if name.startswith("te_offload_shim.") else None
        if lock is not None and hasattr(lock, "__enter__"):
            found.append((name, lock))
    return found


def _free(lock: Any) -> bool:
    """Whether another thread can take `lock` (it is not left held)."""
    taken = threading.Event()

    def take() -> None:
        with lock:
            taken.set()

    threading.Thread(target=take, daemon=True).start()
    return taken.wait(30)


if __name__ == "__main__":
    main()
