"""The package's logger, its warn-once rule, and logging that can never fail an offload.

Every log call of the package goes through `log` or `warn_once`: a handler or filter that raises
(a "warnings are fatal" handler, a broken stream) must not escape into the wrapped offload or a
target's import. A long run must not drown in repeated warnings either.
"""

from __future__ import annotations

import logging

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._reload import kept
from te_offload_shim._signals import raised_by_signal_handler

logger = logging.getLogger("te_offload_shim")

_warned: set[str] = kept(globals(), "_warned", set)  # the state of this module outlives a reload
_lock = kept(globals(), "_lock", Lock)


def log(level: int, message: str, *args: object) -> None:
    """`logger.log`, except that nothing a handler does can raise out of it."""
    try:
        logger.log(level, message, *args)
    except Exception as exc:  # the application's logging is not ours to break, nor to let break us
        if raised_by_signal_handler(exc):
            raise  # but its signal handler's exception is its own, on its way to it


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log `message` as a warning the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    log(logging.WARNING, message, *args)
    return True


def first_line_level() -> int:
    """The level of the line that proves the shim worked, once per process: INFO where the
    application logs INFO; otherwise WARNING on rank 0 (so Python's default logging shows it once
    per job, not once per rank) and INFO, unseen, on the other ranks."""
    if logger.isEnabledFor(logging.INFO):
        return logging.INFO
    return logging.WARNING if _switches.rank() in (None, "0") else logging.INFO


def rank_prefix() -> str:
    rank = _switches.rank()
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
