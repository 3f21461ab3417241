"""What TE asked of its extension, and what it allocated, while counting is on.

`counting()` turns the count on for a block: every twin kernel call is counted by name
(`calls`), and every tensor allocated on the (twin) device is counted in `allocated_bytes` (by the
torch-function mode, harness/te_twin/redirect.py). Used by benchmarks/twin_step_cost.py.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

active = False
calls: collections.Counter[str] = collections.Counter()
allocated_bytes = 0
allocations = 0


def allocated(tensor: Any) -> None:
    global allocated_bytes, allocations
    allocated_bytes += tensor.nbytes
    allocations += 1


def reset() -> None:
    global allocated_bytes, allocations
    calls.clear()
    allocated_bytes = 0
    allocations = 0


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count kernel calls and device allocations in the block (the counts start from zero)."""
    global active
    reset()
    active = True
    try:
        yield
    finally:
        active = False


def kernel(name: str) -> Callable[[F], F]:
    """Mark a function as the twin's kernel `name`: its calls are counted while counting is on."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            if active:
                calls[name] += 1
            return func(*args, **kwargs)

        run.__twin_kernel__ = name  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return wrap
