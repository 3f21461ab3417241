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
        _switch("TE_OFFLOAD_SHIM_NET", "perhaps", "TE_OFFLOAD_SHIM_NET='perhaps' is not 1/0"),
        _switch("TE_OFFLOAD_SHIM_LOG", " loud ", "TE_OFFLOAD_SHIM_LOG='loud' is not warning, info or debug"),
    ],
)
def test_unknown_switch_values_warn_at_import(
    switch: str, value: str, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    import te_offload_shim

    assert te_offload_shim.installed() is True
    assert caplog.text.count(expected) == 1, caplog.text


@pytest.mark.parametrize("value", ["", "1", " On ", "no", "FALSE", "maybe", "2", "info", " Debug", "loud"])
def test_a_value_is_understood_exactly_where_no_problem_is_said(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`install()` loads the checking (integrations/user_targets.py) only where `_switches.understood`
    says a name or value is not: both follow the documented values of each switch."""
    from te_offload_shim import _switches
    from te_offload_shim.integrations.user_targets import switch_problems

    flag_values = {"", "1", "0", "true", "false", "yes", "no", "on", "off"}
    for switch in _switches.ALL_SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    assert set(_switches.VALUES) == {*_switches.FLAGS, _switches.LOG}
    for switch in _switches.VALUES:
        monkeypatch.setenv(switch, value)
        reads = value.strip().lower() in ({"", "warning", "info", "debug"} if switch == _switches.LOG else flag_values)
        said = [p for p in switch_problems(()) if p.startswith(f"{switch}=")]
        assert (_switches.understood(switch), said == []) == (reads, reads), (switch, value, said)
        monkeypatch.delenv(switch)
    assert not _switches.understood("TE_OFFLOAD_SHIM_DISABLED"), "a name that is no switch is not understood"
    monkeypatch.setenv(_switches.STATS, "any text at all")
    assert _switches.understood(_switches.STATS), "a switch that takes any text"


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
