"""Scenario 14: unknown switch values warn at import; the run-time switches do what they are
documented to do (set in a running process, they apply to the next offload)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_util import cached_layer, write_module


def _switch(switch: str, value: str, expected: str) -> object:
    return pytest.param(switch, value, expected, marks=pytest.mark.subprocess(env={switch: value}))


@pytest.mark.parametrize(
    ("switch", "value", "expected"),
    [
        _switch("TE_OFFLOAD_SHIM", "maybe", "TE_OFFLOAD_SHIM='maybe' is not 1/0"),
        _switch("TE_OFFLOAD_SHIM_DISABLE", "verll", "TE_OFFLOAD_SHIM_DISABLE names 'verll', which is no target"),
        _switch("TE_OFFLOAD_SHIM_STRICT", "please", "TE_OFFLOAD_SHIM_STRICT='please' is not 1/0"),
    ],
)
def test_unknown_switch_values_warn_at_import(
    switch: str, value: str, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    import te_offload_shim

    assert te_offload_shim.installed() is True
    assert caplog.text.count(expected) == 1, caplog.text


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "switch_target:offload"})
def test_switches_set_in_a_running_process_apply_to_the_next_offload(tmp_path: Path) -> None:
    import importlib
    import os

    import te_offload_shim

    write_module(tmp_path, "switch_target", "def offload(models):\n    return 'offloaded'\n")
    target = importlib.import_module("switch_target")
    for switch, value in (("TE_OFFLOAD_SHIM", "0"), ("TE_OFFLOAD_SHIM_DISABLE", "switch_target:offload")):
        os.environ[switch] = value
        layer = cached_layer()
        assert target.offload([layer]) == "offloaded"
        assert layer._fp8_workspaces, f"{switch}={value} set at run time must leave the next offload alone"
        del os.environ[switch]
    layer = cached_layer()
    target.offload([layer])
    assert layer._fp8_workspaces == {}, "and switched back on, it clears again"
    assert te_offload_shim.stats()["entries"] == 1
