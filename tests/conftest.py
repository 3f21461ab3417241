"""Shared test plumbing: fresh interpreters with a chosen verl release on the path.

`@pytest.mark.subprocess(...)` runs a real test function in a fresh interpreter (a child pytest that
selects that one test), the way dd-trace-py's marker does: the function is linted and type-checked
like any other, and import state (the shim installed or not, which modules are loaded) starts
clean. The module holding such tests must import nothing heavy at its top: the child imports it.
Keywords: `env` (added to the child's environment), `verl` (a release put on the path), `timeout`,
`args` (extra pytest arguments for the child, e.g. `--assert=plain` for a pristine meta path),
`activate` (the shim is active from interpreter start, as with `te-offload-shim run`), `fresh`.
The test is reported as the child ended it (tests/support/child_outcome.py): passed, skipped with the
child's reason, xfailed or xpassed, failed; a child that ran no test fails.

The child is forked from a fork server that has imported torch, tensordict and transformers and
nothing of the shim or the targets (tests/support/zygote.py says why that is the same start for what these
tests check, and saves about two thirds of each child's CPU). `fresh=True` (and `activate=True`)
starts a really new interpreter: for tests of what start-up itself imports. `TEST_NO_ZYGOTE=1`
starts every child fresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support import bare_venv, child_outcome, node_ids, set_up

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"  # helpers: the fork server, verl's case, Ray's head and driver
DEPS = REPO / ".deps"
BOOTSTRAP = REPO / "te_offload_shim" / "activation" / "bootstrap"
MIRRORS = TESTS / "mirrors"
UNFIXED_VERL = ("0.7.1", "0.8.0")
FIXED_VERL = ("0.9.0", "0.9.1")  # 0.9.0: the table's fixed_in, the first release with the marker
# The declared floor and the last 0.6: they import transformers 4.x (0.6.1's AutoModelForVision2Seq)
# and pkg_resources (0.4.x), served from .deps/verl-legacy-pydeps first on their path, so their tests
# start a fresh interpreter (the fork server has imported transformers 5)
LEGACY_VERL = ("0.4.0", "0.6.1")
LEGACY_PYDEPS = DEPS / "verl-legacy-pydeps"

CHILD = "TEST_SUBPROCESS_NODEID"  # set to the node id in the child that runs it


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "subprocess(env=None, verl=None, timeout=180, args=(), activate=False, fresh=False): run the test in a "
        "fresh interpreter (forked from tests/support/zygote.py unless fresh or activate)",
    )


def child_env(
    env: dict[str, str] | None = None, verl: str | None = None, path: Sequence[str | Path] = ()
) -> dict[str, str]:
    """The environment of a fresh test interpreter: no shim switch leaks in from ours, the repository
    (and a verl release) on the path, and CI's wrapt-1.x prefix when it re-runs a suite."""
    paths = [str(p) for p in path]
    paths += [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    if verl in LEGACY_VERL:
        paths.append(str(legacy_pydeps_path()))
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
    if marker is None:
        return None  # an ordinary test
    nodeid = node_ids.plain(pyfuncitem)  # the child runs without xdist: no `@group` suffix
    if os.environ.get(CHILD) == nodeid:
        return None  # the child running its one test
    opts = marker.kwargs
    env = child_env(opts.get("env"), opts.get("verl"))
    if opts.get("activate"):
        env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), env["PYTHONPATH"]])
    env[CHILD] = nodeid
    basetemp = pyfuncitem.config._tmp_path_factory.mktemp("child", numbered=True)  # type: ignore[attr-defined]
    report = basetemp.with_name(basetemp.name + ".json")  # beside basetemp, which the child empties
    env[child_outcome.REPORT] = str(report)
    # The child runs one test: plugins it does not use stay out (anyio's and looponfail's imports
    # alone double a child pytest's start-up, ~0.7 s of CPU for each of these tests)
    args = [
        nodeid, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:xdist.looponfail",
        "-p", "no:anyio", "-p", "no:randomly", f"--basetemp={basetemp}", "--no-header", "-rN", *opts.get("args", ()),
    ]  # fmt: skip
    if pyfuncitem.config.option.runxfail:  # the suite's --runxfail holds in the child that runs the test
        args.append("--runxfail")
    shown = pyfuncitem.config.getoption("capture") == "no"  # `-s`: the child's prints shown, whatever its outcome
    if shown:
        args.append("-s")
    timeout = opts.get("timeout", 180)
    if opts.get("fresh") or opts.get("activate") or opts.get("verl") in LEGACY_VERL or not _zygote.usable():
        rc, out = _fresh(args, env, timeout)
        where = "a fresh interpreter"
    else:
        rc, out = _zygote.run(
            args, env, timeout, basetemp.with_name(basetemp.name + ".out")
        )  # the child empties basetemp
        where = "an interpreter forked from tests/support/zygote.py"
    if shown:
        print(out)
    if rc is None:
        outcome = child_outcome.Outcome("failed", f"{where} timed out after {timeout} s:\n{out[-4000:]}")
    else:
        outcome = child_outcome.read(report, rc, out, where)
    pyfuncitem.stash[child_outcome.KEY] = outcome
    outcome.raise_here()
    return True


# The report of every test: a child's outcome (its call's report here), then CI's rule on set-up skips.
@pytest.hookimpl(wrapper=True, tryfirst=True)  # tryfirst: its end runs after the skipping plugin's
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    outcome = item.stash.get(child_outcome.KEY, None)
    if outcome is not None and call.when == "call":
        outcome.onto(report)
    set_up.fail_under_ci(report)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    child_outcome.record(report, os.environ.get(CHILD))  # in a child: its test's outcome, for the suite


def _fresh(args: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        return None, repr(exc.stdout or b"")
    return proc.returncode, proc.stdout + "\n" + proc.stderr


class _Zygote:
    """This worker's fork server (tests/support/zygote.py), started at its first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.broken = os.environ.get("TEST_NO_ZYGOTE") == "1" or not hasattr(os, "fork")

    def usable(self) -> bool:
        return not self.broken

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            env = child_env()
            # the zygote's own path stays the interpreter's, less CI's prefix (torch 2.15.0 or wrapt 1.x
            # first), which what it imports must come from too; each child gets its own
            prefix = os.environ.get("TEST_PYTHONPATH_PREFIX")
            if prefix:
                env["PYTHONPATH"] = prefix
            else:
                del env["PYTHONPATH"]
            self.proc = subprocess.Popen(
                [sys.executable, str(SUPPORT / "zygote.py")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
            )  # fmt: skip
        return self.proc

    def run(self, args: list[str], env: dict[str, str], timeout: float, out: Path) -> tuple[int | None, str]:
        import select

        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        paths = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
        request = {"args": args, "env": env, "cwd": str(REPO), "pythonpath": paths, "out": str(out)}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # it is gone (it refused to serve, or died): the empty answer below says so
        first = proc.stdout.readline()
        if not first:
            return self._died(out)
        pid = json.loads(first)["pid"]
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, 9)
            proc.stdout.readline()
            return None, _read(out)
        line = proc.stdout.readline()
        if not line:
            return self._died(out)
        return json.loads(line)["rc"], _read(out)

    def _died(self, out: Path) -> tuple[int, str]:
        self.broken = True  # the remaining tests of this worker start fresh interpreters
        return 71, "the zygote died (its own error is on this worker's stderr)\n" + _read(out)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_zygote = _Zygote()


def mirror_env(*roots: str) -> dict[str, str]:
    """PYTHONPATH for a fresh interpreter (and the Ray workers it starts) that imports the mirrors
    of tests/mirrors/, `roots` (e.g. nemo_rl_v0_5) in front of them."""
    paths = [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    paths += [str(MIRRORS / r) for r in roots] + [str(MIRRORS), str(REPO)]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def use_mirrors(*roots: str) -> None:
    """Put the mirrors (and `roots` in front of them) on this interpreter's path."""
    sys.path[:0] = [str(MIRRORS / r) for r in roots] + [str(MIRRORS)]


@pytest.fixture(scope="module")
def checkout_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv that sees only this checkout, wrapt and packaging (support/bare_venv.py)."""
    return bare_venv.checkout_venv(tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's local Ray cluster, shared by the xdist workers (tests/support/ray_session.py says how
    it keeps the package from its workers unless a job gives it to them)."""
    from support import ray_session

    base = tmp_path_factory.getbasetemp()
    yield from ray_session.shared_cluster(base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent)


def verl_path(version: str) -> Path:
    path = DEPS / f"verl-{version}"
    set_up.needs(path / "verl", f"verl {version} not installed in {path}")
    return path


def legacy_pydeps_path() -> Path:
    set_up.needs(LEGACY_PYDEPS / "transformers", f"transformers 4.x not installed in {LEGACY_PYDEPS}")
    return LEGACY_PYDEPS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per Transformer Engine release: how its real-TE tests went (tests/te/test_te_real.py),
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
        terminalreporter.section("Transformer Engine releases (tests/te/test_te_real.py)")
        for release in sorted(per, key=lambda r: tuple(int(p) for p in r.split("."))):
            c = per[release]
            terminalreporter.line(f"TE {release}: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed")
