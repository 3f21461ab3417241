"""A measurement that fails (the CUDA allocator's counters) never cancels the clear."""

from __future__ import annotations

import pytest
from hostile_util import cached_layer, use_targets


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"})
def test_a_measurement_that_fails_never_cancels_the_clear() -> None:
    import torch

    import te_offload_shim as shim

    def half_initialised(device: object = None) -> int:
        raise RuntimeError("CUDA driver initialisation failed")

    torch.cuda.is_initialized = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_allocated = half_initialised  # type: ignore[assignment]
    layer = cached_layer()
    report = shim.clear_fp8_workspaces([layer])
    assert report.entries == 1 and layer._fp8_workspaces == {}
    assert report.released_bytes is None, "unknown, not a number"
    assert report.bytes > 0, "the byte accounting needs no allocator"

    use_targets()
    import shim_targets  # type: ignore[import-not-found]

    layer = cached_layer()
    assert shim_targets.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}, "the wrapped offload cleared"
    stats = shim.stats()
    assert (stats["entries"], stats["errors"]) == (1, 0), stats
