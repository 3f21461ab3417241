"""Scenario 11 (logging): the offload never depends on the shim's own logging. A handler that
raises (a "warnings are fatal" handler) sees our lines, and the offload goes on regardless."""

from __future__ import annotations

import logging
from typing import NoReturn

import pytest
from hostile_util import ALL_KINDS, cached_layer, use_targets


class _FatalHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())
        raise RuntimeError(f"log lines are fatal here: {record.getMessage()[:40]}")


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ALL_KINDS})
def test_a_raising_log_handler_cannot_stop_the_offload() -> None:
    import te_offload_shim

    use_targets()
    import shim_targets as t

    handler = _FatalHandler()
    logger = logging.getLogger("te_offload_shim")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    layer = cached_layer()
    assert t.offload([layer]) == "offloaded" and layer._fp8_workspaces == {}
    assert any("cleared 1 FP8 weight workspaces" in line for line in handler.seen), "the INFO line was logged"

    class Unreadable(dict):
        def values(self) -> NoReturn:
            raise ValueError("this cache cannot be read")

    broken = cached_layer()
    broken.__dict__["_fp8_workspaces"] = Unreadable(broken._fp8_workspaces)
    # Clearing fails (a warning, which the handler turns into an exception): the offload runs.
    assert t.offload([broken]) == "offloaded"
    assert t.CALLS[-1] == ("offload", [broken])
    assert any("this cache cannot be read" in line for line in handler.seen), "the warning was logged"
    assert te_offload_shim.stats()["calls"] == 2
