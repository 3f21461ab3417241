"""Scenario 6 and 7: the wrapper is invisible to pickle, copy, and to static and class methods."""

from __future__ import annotations

import pytest


@pytest.mark.subprocess()
def test_probe() -> None:
    import sys

    assert "te_offload_shim" not in sys.modules
