"""Shared pieces of the hostile tests: where the target modules live, FP8-cached layers, and a lock
held by another thread."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

TARGETS = Path(__file__).resolve().parent / "targets"
ALL_KINDS = (
    "shim_targets:offload,shim_targets:Engine.offload@models,"
    "shim_targets:Engine.static_offload,shim_targets:Engine.class_offload"
)


def use_targets() -> None:
    """Put the target modules on the path (inside the fresh interpreter)."""
    if str(TARGETS) not in sys.path:
        sys.path.insert(0, str(TARGETS))


def cached_layer() -> Any:
    """A TE-layout linear (TE >= 1.8) whose `_fp8_workspaces` holds an entry, as after a forward."""
    from harness import te_standins as te

    layer = te.TELinearStandIn(8, 8)
    te.fill_like_forward(layer)
    assert layer._fp8_workspaces, "the stand-in must start with a cached entry"
    return layer


def write_module(directory: Path, name: str, source: str) -> None:
    """A module file for tests that need many fresh modules, or one built for a single case."""
    (directory / f"{name}.py").write_text(source)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    import importlib

    importlib.invalidate_caches()


def child_exit_status(pid: int, seconds: float) -> int | None:
    """The exit status of forked child `pid`, or None when it had not ended within `seconds` (it is
    killed then, so a hung child fails its test instead of hanging the suite)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def load_lazily(name: str) -> ModuleType:
    """Import `name` through `importlib.util.LazyLoader`, as scientific-python's lazy_loader and
    networkx do: the module is in sys.modules, and its body runs at the first attribute read."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


@contextlib.contextmanager
def held_by_another_thread(lock: contextlib.AbstractContextManager[Any], timeout: float = 30) -> Iterator[None]:
    """`lock` held by a thread of its own for the `with` block (a fork in it copies the lock held)."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(2 * timeout)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(timeout), "the other thread never took the lock"
        yield
    finally:
        release.set()
        holder.join(timeout)
