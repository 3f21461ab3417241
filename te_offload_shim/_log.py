"""The package's logger, its warn-once rule, logging that can never fail an offload, and the one
fail-open rule (`fail_open`) of every `except Exception` that guards the application's work.

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

_warned: set[str] = set()  # a reload of this module may say a warning once more
_lock = Lock()


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """sys.stderr as it is when a line is written (a test's capture, a redirection made later)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    stream = property(lambda self: sys.stderr)  # type: ignore[assignment]


# Put on the logger (`TE_OFFLOAD_SHIM_LOG`), outside this module: kept by a reload (`kept`), which
# would otherwise leave it there beside a second one.
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
    """Whether a handler the records reach prints the logger's name. Each handler's formatter is asked
    with a record under a name no message holds: its format string is no public attribute, and
    `%`, `{` and `$` styles (or a formatter of the application's own) each spell the name another way."""
    for handler in _handlers():
        probe = logging.LogRecord(_PROBE, logging.INFO, "", 0, "", None, None)
        try:
            if _PROBE in (handler.formatter or logging.Formatter()).format(probe):  # a handler's default
                return True
        except Exception:  # a formatter that cannot format our probe: it shows no name of ours either
            continue
    return False


_PROBE = "te_offload_shim.name-probe"


def _own_handler_if_none() -> None:
    """TE_OFFLOAD_SHIM_LOG: our stderr handler while the application configured none, never beside one."""
    if _handlers():
        logger.removeHandler(_own)
    elif _own not in logger.handlers:
        logger.addHandler(_own)


def warn_once(key: str, message: str, *args: object) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    log(logging.WARNING, message, *args)


def describe_error(exc: BaseException) -> str:
    """`Type: message` of `exc`. Never raises (an exception whose `__str__` raises is named by its
    type), and keeps no reference: a log record or report holding the exception would keep its
    traceback's frames alive, and the tensors in them (a clearing's popped caches)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def fail_open(exc: Exception, key: str, message: str, *args: object, strict: bool | None = None) -> None:
    """The shim's one fail-open rule, for every `except Exception as exc:` that guards the
    application's work (an offload, a flush, an import, `ray.init`, an actor's creation) from the
    shim's own failure. Call it first in the `except` block, and count or record the failure after
    it returns (what it raises is no failure of the shim's to count):

    - what the application's signal handler raised (a step timeout from SIGALRM, a preemption notice)
      is the application's own, on its way to it: raised on unchanged (_signals.py);
    - strict mode raises the shim's own error: `TE_OFFLOAD_SHIM_STRICT=1`, or `strict` where the
      caller decides (te/ reads no switch, and passes False: its entry raises `ShimError` once the
      whole call is done);
    - otherwise `message` is said once per `key` (the log is the operator's, a long run must not
      drown in it), and the caller goes on without what failed. An exception in `args` is said as
      `describe_error` gives it (`%s`): the record keeps no reference to it.

    The import hook (`_hook.py`) calls it with `strict=False`: a callback never fails an import, even
    in strict mode. The sites that differ on purpose keep their own code, and say why there: the flush
    net's wrapper (`engine/net.py`: it must work while the interpreter tears modules down),
    `engine/patch.apply` (an import callback: never strict; its caller says what failed), and
    `log` above (a logging handler's failure is not warned about through logging)."""
    if raised_by_signal_handler(exc) or (_switches.strict() if strict is None else strict):
        raise exc
    warn_once(key, message, *(describe_error(a) if isinstance(a, BaseException) else a for a in args))


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
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"
