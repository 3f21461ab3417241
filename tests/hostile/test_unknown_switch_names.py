"""A misspelt switch name does not pass in silence: `TE_OFFLOAD_SHIM_DISABLED=verl` (for
`TE_OFFLOAD_SHIM_DISABLE`) switches nothing off, so an operator's "turn it off" would do nothing.
Every `TE_OFFLOAD_SHIM*` name the package does not read warns once, at import, naming the closest
real switch; the names the package reads never warn."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import child_env

NOT_A_SWITCH = "is no switch of te_offload_shim and does nothing"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if NOT_A_SWITCH in r.getMessage()]


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_DISABLED": "verl"})
def test_a_misspelt_switch_warns_once_naming_the_real_one(caplog: pytest.LogCaptureFixture) -> None:
    import te_offload_shim

    assert te_offload_shim.installed()
    te_offload_shim.uninstall()
    te_offload_shim.install()  # once per process, however often it installs
    assert _warnings(caplog) == [
        "TE_OFFLOAD_SHIM_DISABLED is no switch of te_offload_shim and does nothing "
        "(did you mean TE_OFFLOAD_SHIM_DISABLE?)"
    ]
    assert caplog.records[0].levelname == "WARNING"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_XYZZY": "1"})
def test_a_name_close_to_no_switch_lists_the_real_ones(caplog: pytest.LogCaptureFixture) -> None:
    import te_offload_shim

    assert te_offload_shim.installed()
    (warning,) = _warnings(caplog)
    assert warning.startswith("TE_OFFLOAD_SHIM_XYZZY is no switch")
    assert "(the switches: TE_OFFLOAD_SHIM, TE_OFFLOAD_SHIM_STRICT, TE_OFFLOAD_SHIM_DISABLE," in warning


KNOWN = {
    "TE_OFFLOAD_SHIM": "1",
    "TE_OFFLOAD_SHIM_STRICT": "0",
    "TE_OFFLOAD_SHIM_FORCE_CUDA_GRAPHS": "0",
    "TE_OFFLOAD_SHIM_AUDIT": "0",
    "TE_OFFLOAD_SHIM_NET": "1",
    "TE_OFFLOAD_SHIM_TE_GLOBALS": "1",
}


def test_the_switches_the_package_reads_never_warn() -> None:
    """In a plain interpreter (pytest itself loads difflib): nothing said, and nothing loaded for it:
    neither the closest-name search nor the install-time warnings, only the switches module."""
    probe = (
        "import sys, te_offload_shim; assert te_offload_shim.installed(); "
        "print(sorted(m for m in sys.modules if m.startswith('te_offload_shim')), 'difflib' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env(KNOWN))
    assert (proc.returncode, proc.stderr) == (0, "")
    start_up = ["te_offload_shim", "te_offload_shim._hook", "te_offload_shim._switches", "te_offload_shim._version"]
    assert proc.stdout == f"{start_up} False\n"
    from te_offload_shim import _switches

    assert set(KNOWN) <= set(_switches.ALL_SWITCHES), "every name of the test is a switch"
