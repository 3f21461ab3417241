"""What TE asked of its extension, and what it allocated on the device, while counting is on.

`counting()` turns the count on for a block: every twin kernel call TE makes is counted by name
(`calls`; kernels a kernel calls are not), and every tensor allocated on the (twin) device is
counted in `allocated_bytes` / `allocations` by the torch-function mode (redirect.py): an
allocation that names the CUDA device (TE's Python, and the extension's outputs, which the twin
allocates on "cuda" as the C++ does), or a `*_like` allocation in TE's Python (its tensors all live
on the device). The twin's own float32 temporaries are not device memory and are not counted.
Used by benchmarks/twin_step_cost.py.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

active = False
depth = 0  # > 0 while a twin kernel runs
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
            global depth
            if active and depth == 0:
                calls[name] += 1
            depth += 1
            try:
                return func(*args, **kwargs)
            finally:
                depth -= 1

        run.__twin_kernel__ = name  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return wrap
