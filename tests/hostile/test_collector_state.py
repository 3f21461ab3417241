"""Clearing leaves the cyclic collector exactly as the application has it."""

from __future__ import annotations

import pytest
from hostile_util import cached_layer


@pytest.mark.subprocess()
def test_clearing_leaves_the_collector_as_the_application_set_it() -> None:
    import gc
    import threading

    import te_offload_shim as shim

    class Workspaces(dict):
        """While the clearing reads the cache, another thread turns the collector off for good
        (Megatron's manual GC does this at the start of training)."""

        def values(self):  # type: ignore[no-untyped-def, override]
            other = threading.Thread(target=gc.disable)
            other.start()
            other.join()
            return super().values()

    layer = cached_layer()
    layer._fp8_workspaces = Workspaces(layer._fp8_workspaces)
    assert gc.isenabled()
    try:
        report = shim.clear_fp8_workspaces([layer])
        assert report.entries == 1 and not layer._fp8_workspaces
        assert not gc.isenabled(), "the application turned the collector off: it stays off"
    finally:
        gc.enable()
