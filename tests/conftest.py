"""Shared test plumbing: fresh interpreters with a chosen verl release on the path.

`@pytest.mark.subprocess(...)` runs a real test function in a fresh interpreter (a child pytest that
selects that one test), the way dd-trace-py's marker does: the function is linted and type-checked
like any other, and import state (the shim installed or not, which modules are loaded) starts
clean. The module holding such tests must import nothing heavy at its top: the child imports it.
Keywords: `env` (added to the child's environment), `verl` (a release put on the path), `timeout`,
`args` (extra pytest arguments for the child, e.g. `--assert=plain` for a pristine meta path),
`activate` (the shim is active from interpreter start, as with `te-offload-shim run`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
BOOTSTRAP = REPO / "te_offload_shim" / "activation" / "bootstrap"
MIRRORS = REPO / "tests" / "mirrors"
UNFIXED_VERL = ("0.7.1", "0.8.0")
FIXED_VERL = ("0.9.1",)

CHILD = "TE_OFFLOAD_SHIM_TEST_CHILD"  # set to the node id in the child that runs it


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "subprocess(env=None, verl=None, timeout=180, args=()): run the test in a fresh interpreter"
    )


def child_env(
    env: dict[str, str] | None = None, verl: str | None = None, path: list[str | Path] = ()
) -> dict[str, str]:  # type: ignore[assignment]
    """The environment of a fresh test interpreter: no shim switch leaks in from ours, the repository
    (and a verl release) on the path, and CI's wrapt-1.x prefix when it re-runs a suite."""
    paths = [str(p) for p in path]
    paths += [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    paths.append(str(REPO))
    if verl is not None:
        paths.append(str(verl_path(verl)))
    full = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    full["PYTHONPATH"] = os.pathsep.join(paths)
    full.update(env or {})
    return full


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("subprocess")
    if marker is None or os.environ.get(CHILD) == pyfuncitem.nodeid:
        return None  # an ordinary test, or the child running its one test
    opts = marker.kwargs
    env = child_env(opts.get("env"), opts.get("verl"))
    if opts.get("activate"):
        env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), env["PYTHONPATH"]])
    env[CHILD] = pyfuncitem.nodeid
    basetemp = pyfuncitem.config._tmp_path_factory.mktemp("child", numbered=True)  # type: ignore[attr-defined]
    command = [
        sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
        "-p", "no:randomly", f"--basetemp={basetemp}", "--no-header", "-rN", *opts.get("args", ()),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=REPO, timeout=opts.get("timeout", 180)
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"fresh interpreter timed out after {exc.timeout} s:\n{(exc.stdout or b'')[-4000:]!r}", pytrace=False
        )
    if proc.returncode != 0:
        pytest.fail(
            f"in a fresh interpreter ({proc.returncode}):\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}", pytrace=False
        )
    return True


def mirror_env(*roots: str) -> dict[str, str]:
    """PYTHONPATH for a fresh interpreter (and the Ray workers it starts) that imports the mirrors
    of tests/mirrors/, `roots` (e.g. nemo_rl_v0_5) in front of them."""
    paths = [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    paths += [str(MIRRORS / r) for r in roots] + [str(MIRRORS), str(REPO)]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def use_mirrors(*roots: str) -> None:
    """Put the mirrors (and `roots` in front of them) on this interpreter's path."""
    sys.path[:0] = [str(MIRRORS / r) for r in roots] + [str(MIRRORS)]


def verl_path(version: str) -> Path:
    path = DEPS / f"verl-{version}"
    if not (path / "verl").is_dir():
        pytest.skip(f"verl {version} not installed in {path} (run scripts/setup-env.sh)")
    return path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per Transformer Engine release: how its real-TE tests went (tests/test_te_real.py),
    so CI output shows each release's passes and skips (`-rs` gives the skip reasons)."""
    import re

    per: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "skipped", "failed"):
        for rep in terminalreporter.stats.get(outcome, []):
            found = re.search(r"test_te_real\.py::.*\[(\d+\.\d+\.\d+)", getattr(rep, "nodeid", ""))
            if found and (rep.when == "call" or outcome == "skipped"):
                counts = per.setdefault(found.group(1), {"passed": 0, "skipped": 0, "failed": 0})
                counts[outcome] += 1
    if per:
        terminalreporter.section("Transformer Engine releases (tests/test_te_real.py)")
        for release in sorted(per, key=lambda r: tuple(int(p) for p in r.split("."))):
            c = per[release]
            terminalreporter.line(f"TE {release}: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed")
