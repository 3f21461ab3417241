"""The package's logger, its warn-once rule, and logging that can never fail an offload.

Every log call of the package goes through `log` or `warn_once`: a handler or filter that raises
(a "warnings are fatal" handler, a broken stream) must not escape into the wrapped offload or a
target's import. A long run must not drown in repeated warnings either. Each line says the rank
(`[rank N]`) in a distributed job, and names the shim once: by the application's `%(name)s` where
its format has one, else by the message's own `te_offload_shim: `.

`TE_OFFLOAD_SHIM_LOG=warning|info|debug` sets the logger's level, and gives it its own stderr
handler while the application has configured none (with one, its handlers print the lines: one each).
"""

from __future__ import annotations

import logging
import sys

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._reload import kept
from te_offload_shim._signals import raised_by_signal_handler

logger = logging.getLogger("te_offload_shim")
PREFIX = "te_offload_shim: "

_warned: set[str] = kept(globals(), "_warned", set)  # the state of this module outlives a reload
_lock = kept(globals(), "_lock", Lock)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """sys.stderr as it is when a line is written (a test's capture, a redirection made later)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    stream = property(lambda self: sys.stderr)  # type: ignore[assignment]


_own: logging.Handler = kept(globals(), "_own", _Stderr)
if _switches.log_level() is not None:
    logger.setLevel(_switches.log_level() or 0)


def log(level: int, message: str, *args: object) -> None:
    """`logger.log`, tagged with the rank, except that nothing a handler does can raise out of it."""
    try:
        if _switches.log_level() is not None:
            _own_handler_if_none()
        if not logger.isEnabledFor(level):
            return
        rank = _switches.rank()
        body = message.removeprefix(PREFIX)
        head = ("" if _names_shown() else PREFIX) + (f"[rank {rank}] " if rank is not None else "")
        logger.log(level, head.replace("%", "%%") + body, *args)
    except Exception as exc:  # the application's logging is not ours to break, nor to let break us
        if raised_by_signal_handler(exc):
            raise  # but its signal handler's exception is its own, on its way to it


def _handlers() -> list[logging.Handler]:
    """The handlers a record of the shim's logger reaches, but ours."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += [h for h in current.handlers if h is not _own]
        current = current.parent if current.propagate else None
    return found


def _names_shown() -> bool:
    """Whether a handler the records reach prints the logger's name (`%(name)s`, `{name}`)."""
    for handler in _handlers():
        fmt = str(getattr(handler.formatter, "_fmt", "") or "")
        if "%(name)" in fmt or "{name" in fmt:
            return True
    return False


def _own_handler_if_none() -> None:
    """TE_OFFLOAD_SHIM_LOG: our stderr handler while the application configured none, never beside one."""
    if _handlers():
        logger.removeHandler(_own)
    elif _own not in logger.handlers:
        logger.addHandler(_own)


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


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
