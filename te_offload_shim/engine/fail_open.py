"""The shim's one fail-open rule, for every `except Exception` that guards the application's work
(an offload, an import, `ray.init`, an actor's creation) from the shim's own failure.

- What the application's signal handler raised (a step timeout from SIGALRM, a preemption notice)
  is the application's own, on its way to it: it goes on unchanged (_signals.py).
- Strict mode (`TE_OFFLOAD_SHIM_STRICT=1`, for tests) raises the shim's own error.
- Otherwise it is said once per `key` (the log is the operator's, a long run must not drown in it),
  and the caller goes on without what failed.
"""

from __future__ import annotations

from te_offload_shim import _switches
from te_offload_shim._log import warn_once
from te_offload_shim._signals import raised_by_signal_handler


def fail_open(exc: Exception, key: str, message: str, *args: object) -> None:
    """Call in `except Exception as exc:`: raises `exc` where the rule above says so, else warns once."""
    if raised_by_signal_handler(exc) or _switches.strict():
        raise exc
    warn_once(key, message, *args)
