"""The package's logger and its warn-once rule: a long run must not drown in repeated warnings."""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("te_offload_shim")

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log `message` as a warning the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    logger.warning(message, *args)
    return True


def rank_prefix() -> str:
    rank = os.environ.get("RANK")
    return f"[rank {rank}] " if rank else ""


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
