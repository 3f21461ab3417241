"""The fresh interpreter of the smoke test of signals: on this Python, a `with` on a lock of the
package is never left held by a signal handler's exception (CPython enters and exits the raw lock in
C; bpo-29988 is about the window between), and 10,000 offloads interrupted at random points by
KeyboardInterrupts leave every lock of the package free. Each loop runs until a fixed number of
interrupts has landed (not a fixed number of calls): on a loaded machine a timer lands later, and a
count of calls made the figure depend on the load (62 interrupts in 10,000 offloads on CI, beside
another pass). Prints one JSON line.

    python tests/smoke/signal_probe.py
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import statistics
import sys
import threading
import time
from typing import Any

LOCK_INTERRUPTS = 200  # interrupts landed in the `with lock:` loop
OFFLOAD_INTERRUPTS = 2_000  # interrupts landed in offloads
SECONDS_AT_MOST = 15.0  # a loop that lands too few interrupts stops then and reports how many
STEPS_PER_TIMER = 2_000  # a timer whose interrupt never arrives (seen once in 3 loaded runs) is re-armed


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

    lock_left_held = _interrupted(locked_step, armed, 1e-5, LOCK_INTERRUPTS, lambda: lock._is_owned())  # type: ignore[attr-defined]
    spans = []
    for _ in range(51):
        started = time.perf_counter()
        smoke_target.offload([])
        spans.append(time.perf_counter() - started)
    span = statistics.median(spans)  # one call descheduled must not set the timer
    interrupts = _interrupted(lambda: smoke_target.offload([]), armed, span, OFFLOAD_INTERRUPTS, lambda: False)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    held = [name for name, lock in _package_locks() if not _free(lock)]
    print(json.dumps({
        "python": list(sys.version_info[:2]),
        "lock_left_held": lock_left_held,
        "interrupts": interrupts,
        "held": held,
        "calls": shim.stats()["calls"],
    }))  # fmt: skip


def _interrupted(step: Any, armed: list[bool], span: float, wanted: int, held: Any) -> Any:
    """Run `step` until `wanted` KeyboardInterrupts have landed at random points of it (or
    SECONDS_AT_MOST have passed); returns how many landed, or "held after N" the first time `held()`
    says a lock was left held."""
    rng = random.Random(27)
    hits = 0
    until = time.monotonic() + SECONDS_AT_MOST
    try:
        while hits < wanted and time.monotonic() < until:
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0, 2 * span) + 1e-6)
                _steps(step)
                armed[0] = False  # no interrupt in STEPS_PER_TIMER steps: none may land outside the `try`
            except KeyboardInterrupt:
                hits += 1
            if held():
                return f"held after {hits}"
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    return hits


def _steps(step: Any) -> None:
    # Its own frame: on CPython 3.11 - 3.13 an exception raised by a signal handler at a loop's
    # back-edge can miss the `try` of the same frame (python/cpython#108214, #130279).
    for _ in range(STEPS_PER_TIMER):
        step()


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
