"""`TE_OFFLOAD_SHIM_AUDIT=1`: after each wrapped offload returns, what it left on the device.

The call path asks `begin()` right before the original offload runs (the shim's own clearing is
done by then) and calls `finish()` on what it got once the original has returned. This module is
loaded there, only where the audit is on; a call the shim left alone (or the shim switched off) has
its chunks found here, through the handler's own reading of the call (`locate`). In between this
holds the located model chunks, as the call itself does; afterwards nothing: the report is plain
data, handed to the engine's counter (which keeps the latest for `stats()`) and returned. Nothing
here may raise into the offload, strict mode included: a diagnostic that can break the run it
diagnoses would not be switched on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from te_offload_shim import _switches
from te_offload_shim._log import fail_open, log


class Target(Protocol):
    """What the audit reads of the target whose offload it watches (an `engine.schema.Target`; the
    engine calls this module, so the reports name no engine type)."""

    @property
    def path(self) -> str: ...


class Pending:
    """An offload under audit: its chunks and when it started."""

    __slots__ = ("device_type", "models", "started", "target")

    def __init__(self, target: Target, models: Any, device_type: str | None) -> None:
        self.target = target
        self.models = models
        self.device_type = device_type
        self.started = time.perf_counter()

    def finish(self, count: Callable[[dict[str, Any]], int]) -> dict[str, Any] | None:
        """Report what the offload left: the report as plain data (`ResidueReport.as_dict()` plus
        target, time and how long the offload took), handed to `count` (the engine's counter, which
        returns the level of its line) and logged at that level; None where it failed. Never raises."""
        try:
            from te_offload_shim.reports import residue

            report = residue.residue(self.models, device_type=self.device_type)
            seconds = time.perf_counter() - self.started
            found = {"target": self.target.path, "offload_s": seconds, "time": time.time(), **report.as_dict()}
            log(count(found), "te_offload_shim: audit after %s: %s", self.target.path, report.summary())
            return found
        except Exception as exc:
            fail("finish", exc)
            return None
        finally:
            self.models = None


def begin(target: Target, models: Any, locate: Callable[[], Any] | None = None) -> Pending | None:
    """Start auditing one offload of `models`; where the call was left alone (`models` None), of the
    chunks `locate()` finds (the handler's reading of the call). Never raises."""
    try:
        if models is None and locate is not None:
            models = locate()
    except Exception as exc:  # `models` is still None
        fail("locate", exc)
    try:
        return Pending(target, models, _switches.audit_device_type())
    except Exception as exc:
        fail("begin", exc)
        return None


def fail(step: str, exc: Exception) -> None:
    """The audit's fail-open rule: said once per step and kind, never raised, strict mode included (a
    diagnostic must not break the run it diagnoses); but the application's signal handler's
    exception is the application's own, and goes on its way to it."""
    key = f"audit:{step}:{type(exc).__name__}"
    fail_open(exc, key, "te_offload_shim: residue audit (%s) failed: %s", step, exc, strict=False)
