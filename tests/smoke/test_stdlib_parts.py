"""Smoke test of the package's standard-library parts on every supported Python (scripts/test.sh
runs this folder with CPython 3.10, 3.12 and 3.13, each from a venv holding only wrapt and pytest;
the main suite runs it on the venv's Python).

Each check starts fresh interpreters of the Python running this file (`sys.executable`): the import
watcher patching a `TE_OFFLOAD_SHIM_TARGETS` function whether its module is imported before or
after the shim, the CLI (`--version`, `status`), the `.pth` route (`enable --site DIR`) and `run`.
Every module of the package is compiled too, so syntax this Python lacks fails here even in a
module no check imports (they need torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import signal_probe  # tests/smoke is on the path (pytest's rootdir import of a test folder without __init__.py)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE = REPO / "te_offload_shim"
TARGET = "smoke_target:offload"


def _version() -> str:
    for line in (PACKAGE / "_version.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split('"')[1]
    raise AssertionError("no __version__ line in te_offload_shim/_version.py")


def _env(**extra: str) -> dict[str, str]:
    """This checkout and the target module on the path; no shim switch leaks in from ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
    env["TE_OFFLOAD_SHIM_TARGETS"] = TARGET
    env.update(extra)
    return env


def _python(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env or _env(), cwd=cwd, timeout=60
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _probe(*args: str, env: dict[str, str] | None = None) -> dict:
    out = _python(str(HERE / "probe.py"), *args, env=env).stdout.splitlines()
    report = json.loads(out[-1])
    assert report["python"] == list(sys.version_info[:2])
    assert Path(report["shim_file"]).resolve() == PACKAGE / "__init__.py", "not this checkout's package"
    return report


def _patched(report: dict) -> None:
    """The target is wrapped once, reported patched, and the call reached the original intact."""
    assert report["layers"] == 1, report
    assert report["row"] is not None and report["row"]["state"] == "patched", report["row"]
    assert report["passed_through"] and report["calls"] == 1, report


@pytest.mark.parametrize("spec", ["file", "find"])
def test_a_lazily_loaded_target_is_pending_until_its_body_runs_then_patched(spec: str) -> None:
    """`importlib.util.LazyLoader` (scientific Python's `lazy_loader`): before the module's first use
    its row says `pending`, not imported, and nothing is warned; its first use runs the body, and the
    next import patches it. On 3.12+ `LazyLoader.exec_module` imports `threading` with the module in
    sys.modules and its body not run: the hook fired then, status said `absent`, a user target was
    warned about, and with a spec from `spec_from_file_location` it stayed unpatched for good."""
    proc = _python(str(HERE / "lazy_probe.py"), "--spec", spec)
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["python"] == list(sys.version_info[:2])
    if sys.version_info >= (3, 12):
        assert not report["threading_before"], "threading was loaded already: the 3.12+ case did not happen"
    assert (report["before"]["state"], report["before"]["imported"]) == ("pending", False), report["before"]
    assert "te_offload_shim" not in proc.stderr, proc.stderr
    assert (report["after"]["state"], report["layers"]) == ("patched", 1), report
    # through our finder the lazy load runs our chained loader, which patches before the first call
    assert report["passed_through"] and report["calls"] == (2 if spec == "find" else 1), report


def test_every_module_compiles_on_this_python() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20
    for path in modules:
        compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)


@pytest.mark.parametrize("shim", ["first", "after"])
def test_watcher_patches_a_user_target(shim: str) -> None:
    """`import te_offload_shim` before the target module (patched on its import) or after it
    (patched at install)."""
    report = _probe("--shim", shim)
    assert report["shim_before_target"] is (shim == "first")
    _patched(report)


def test_unpatched_without_the_shim_switch() -> None:
    """The checks above can fail: with TE_OFFLOAD_SHIM=0 the same probe finds nothing wrapped."""
    report = _probe("--shim", "first", env=_env(TE_OFFLOAD_SHIM="0"))
    assert report["layers"] == 0 and report["calls"] == 0 and report["passed_through"]


def test_cli_version_and_status() -> None:
    version = _python("-m", "te_offload_shim", "--version").stdout.strip()
    assert version.partition(" (commit ")[0] == f"te-offload-shim {_version()}", "the commit, in a checkout"
    text = _python("-m", "te_offload_shim", "status").stdout
    assert text.splitlines()[-1] == "healthy", text
    # no --import: in the main suite's venv that would import megatron-core (torch), 20 s
    report = json.loads(_python("-m", "te_offload_shim", "status", "--json").stdout)
    assert report["healthy"] and report["python"]["executable"] == sys.executable
    assert report["python"]["version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    (row,) = [r for r in report["targets"] if r["target"] == TARGET]
    assert row["user"] and row["present"] and row["would_be_patched"], row


def test_pth_route(tmp_path: Path) -> None:
    """`enable --site DIR` writes the .pth; an interpreter that reads DIR as a site directory is
    patched without importing the package itself."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    out = _python("-m", "te_offload_shim", "enable", "--site", str(site_dir)).stdout
    assert (site_dir / "te_offload_shim.pth").is_file() and "te_offload_shim.pth" in out
    report = _probe("--site", str(site_dir))
    assert report["shim_before_target"], "the .pth line did not activate the shim"
    _patched(report)
    _python("-m", "te_offload_shim", "disable", "--site", str(site_dir))
    assert not (site_dir / "te_offload_shim.pth").exists()


def test_run_route(tmp_path: Path) -> None:
    """`te-offload-shim run -- python probe.py`: the child is patched from its start."""
    proc = _python("-m", "te_offload_shim", "run", "--", sys.executable, str(HERE / "probe.py"), cwd=tmp_path)
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["python"] == list(sys.version_info[:2])
    assert report["shim_at_start"], "run did not activate the shim at the child's start"
    _patched(report)


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="no interval timer on this platform")
def test_signals_leave_no_lock_of_the_package_held_on_this_python() -> None:
    """Issue 27, finding 1, on every supported Python: a raw lock in a `with` statement survives a
    handler's exception at any point (checked, not trusted: bpo-29988), and so do the offloads."""
    out = _python(str(HERE / "signal_probe.py")).stdout.splitlines()
    report = json.loads(out[-1])
    assert report["python"] == list(sys.version_info[:2])
    assert report["lock_left_held"] == signal_probe.LOCK_INTERRUPTS, report
    assert report["interrupts"] == signal_probe.OFFLOAD_INTERRUPTS, report
    assert report["held"] == [], report
    assert report["calls"] >= 2, report


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_during_the_first_load_imports_its_targets_on_this_python() -> None:
    """Issue 27, finding 2, on every supported Python: the fork waits for the load (issue 35)."""
    env = _env(TE_OFFLOAD_SHIM_TARGETS=f"{TARGET},smoke_target_next:offload")
    report = json.loads(_python(str(HERE / "fork_probe.py"), env=env).stdout.splitlines()[-1])
    assert report == {"python": list(sys.version_info[:2]), "child": 0, "waited": True}, report


def test_the_hooks_at_fork_raise_nothing_on_this_python() -> None:
    """A plain interpreter registers the hook's at-fork hooks twice (again once a callback loaded
    logging, to run before logging's): a fork runs both, and neither may raise (Python would print
    each exception to stderr, at every fork of the application)."""
    env = _env(TE_OFFLOAD_SHIM_TARGETS=f"{TARGET},smoke_target_next:offload")
    proc = _python(str(HERE / "fork_probe.py"), env=env)
    assert "Exception ignored" not in proc.stderr, proc.stderr
