"""Whether an exception is the application's own, raised by its signal handler.

CPython runs a Python signal handler between bytecodes of the main thread, wherever that thread is:
inside the shim's clearing, or a post-import callback. What the handler raises (a step timeout from
a SIGALRM handler, a preemption notice turned into an exception) is on its way to the application,
which waits for it; without the shim it would have reached it from wherever the thread was. So the
shim's fail-open paths, which catch `Exception`, hand such an exception on unchanged instead of
taking it for a failure of their own. It is recognised by the handler's frame in its traceback: the
code of a handler `signal.getsignal` returns now.

Reads only `_signal`, which every interpreter has loaded at start, and imports only `sys`: the
import hook loads it after a module's body, while the exception it looks at is on its way.
"""

import sys

TYPE_CHECKING = False

if TYPE_CHECKING:
    from types import TracebackType


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether `exc` came out of (or through) a Python signal handler installed now. Never raises."""
    try:
        signals = sys.modules.get("_signal")
        if signals is None or exc.__traceback__ is None:
            return False
        codes = set()
        for signum in signals.valid_signals():
            handler = signals.getsignal(signum)
            handler = getattr(handler, "func", handler)  # functools.partial
            handler = getattr(handler, "__func__", handler)  # a bound method
            codes.add(getattr(handler, "__code__", None))  # None (SIG_DFL, a builtin) matches no frame
        tb: TracebackType | None = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return True
            tb = tb.tb_next
    except Exception:
        pass
    return False
