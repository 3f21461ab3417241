"""`te-offload-shim enable` / `disable` the way clusters run them: under a restrictive umask (a
hardened root shell, a Slurm prolog), for other users of the interpreter, from many containers or
nodes at once sharing one venv (processes with the same PID, in PID namespaces), in a site directory
others can write into, on a read-only mount.

Each venv here is a real one (`python -m venv`) holding a copy of the package, and every command is
the real CLI run by that venv's interpreter. What needs root (another user, `unshare`) is skipped,
with the reason, where the machine does not allow it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DEPS, REPO
from support.bare_venv import install_packaging

from te_offload_shim.activation import pth

RUN_FILES = REPO / "tests" / "run_files"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def _run(*cmd: object, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", _env())
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class Venv:
    """A venv of `python` holding a copy of the package (and wrapt 1.x through a path .pth)."""

    def __init__(self, root: Path, python: str) -> None:
        _run(python, "-m", "venv", "--without-pip", root)
        self.python = root / "bin" / "python"
        query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site = Path(_run(self.python, "-c", query).stdout.strip())
        shutil.copytree(
            REPO / "te_offload_shim", self.site / "te_offload_shim", ignore=shutil.ignore_patterns("__pycache__")
        )
        (self.site / "wrapt_1.pth").write_text(f"{DEPS / 'wrapt-1'}\n")
        install_packaging(self.site)
        self.pth = self.site / pth.PTH_NAME

    def cli(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return _run(self.python, "-m", "te_offload_shim", *args, **kwargs)


def _first_line(worker: subprocess.Popen[str]) -> dict:
    line = worker.stdout.readline() if worker.stdout else ""
    if not line:
        out, err = worker.communicate(timeout=60)
        raise AssertionError(f"the worker said nothing ({worker.returncode}):\n{out}\n{err}")
    return json.loads(line)


def _umask_077() -> None:
    os.umask(0o077)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_enable_under_umask_077_writes_a_file_every_user_can_read(tmp_path: Path) -> None:
    venv = Venv(tmp_path / "venv", sys.executable)
    proc = venv.cli("enable", preexec_fn=_umask_077)
    assert proc.stdout.splitlines()[0] == f"te-offload-shim: enabled: {venv.pth}"
    assert _mode(venv.pth) == 0o644, "site.py skips a .pth it cannot read: other users would start without the shim"
    # A 0600 file left by an older release (or copied by hand) is made readable, not called enabled
    venv.pth.chmod(0o600)
    proc = venv.cli("enable", preexec_fn=_umask_077)
    assert proc.stdout.splitlines()[0] == f"te-offload-shim: updated: {venv.pth}"
    assert _mode(venv.pth) == 0o644
    assert venv.cli("enable").stdout.strip() == f"te-offload-shim: already enabled: {venv.pth}"
    status = json.loads(venv.cli("status", "--json").stdout)
    assert status["routes"]["pth"] == [{"path": str(venv.pth), "current": True, "readable": True, "mode": "0644"}]


def test_a_pth_of_our_name_that_is_not_utf8_is_replaced(tmp_path: Path) -> None:
    """A file left damaged (an editor's encoding, a disk that filled up under another tool) in the
    site-packages of another interpreter (`--site`; in this interpreter's own, CPython 3.11 would not
    even start: its site.py dies on a .pth that is not UTF-8)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / pth.PTH_NAME).write_bytes(b"import os\xff\xfe\n")
    proc = _cli("enable", "--site", str(site))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[0] == f"te-offload-shim: updated: {site / pth.PTH_NAME}"
    assert (site / pth.PTH_NAME).read_text() == pth.PTH_TEXT


# --- another user --------------------------------------------------------------------------------


def _python_for(uid: int, gid: int) -> str | None:
    """A CPython >= 3.10 that the user can execute (the venvs of root's pyenv may sit in /root)."""
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or ""]
    candidates += [f"/usr/bin/python3.{minor}" for minor in range(10, 15)] + ["/usr/bin/python3"]
    for exe in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        try:
            probe = subprocess.run(
                [exe, "-c", "import sys; print(sys.version_info >= (3, 10))"],
                capture_output=True, text=True, user=uid, group=gid, extra_groups=[], env=_env(), cwd="/",
            )  # fmt: skip
        except OSError:  # not even executable for that user
            continue
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return exe
    return None


@pytest.fixture
def other_user() -> Iterator[tuple[int, int, Path]]:
    """An unprivileged user (nobody), an interpreter it can run, and a folder it can read."""
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    shared = Path(tempfile.mkdtemp(prefix="te-offload-shim-users-"))
    shared.chmod(0o755)  # pytest's own temporary folders are 0700: the other user could not enter them
    try:
        yield user.pw_uid, user.pw_gid, shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_pth_written_under_umask_077_works_for_another_user_and_status_says_when_it_cannot(
    other_user: tuple[int, int, Path],
) -> None:
    uid, gid, shared = other_user
    python = _python_for(uid, gid)
    if python is None:
        pytest.skip("no Python >= 3.10 that user 'nobody' can execute")
    venv = Venv(shared / "venv", python)
    probe = shared / "enable_probe.py"
    shutil.copy(RUN_FILES / "enable_probe.py", probe)
    for dirpath, dirnames, filenames in os.walk(shared):  # the venv as `pip install` under umask 022 leaves it
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | stat.S_IRGRP | stat.S_IROTH | (0o055 if name in dirnames else 0))
    as_user: dict[str, Any] = {
        "user": uid,
        "group": gid,
        "extra_groups": [],
        "cwd": shared,
        "env": _env(HOME=str(shared)),
    }

    def users_view() -> tuple[bool, subprocess.CompletedProcess[str]]:
        loaded = json.loads(_run(venv.python, probe, **as_user).stdout)["loaded"]
        return loaded, venv.cli("status", "--json", check=False, **as_user)

    venv.cli("enable", preexec_fn=_umask_077)  # root, umask 077: a hardened shell, a Slurm prolog
    loaded, status = users_view()
    assert loaded is True, "another user's interpreter must run the .pth that root wrote under umask 077"
    s = json.loads(status.stdout)
    assert status.returncode == 0 and s["healthy"] is True, s["problems"]
    assert s["routes"]["in_force"] == ".pth"

    venv.pth.chmod(0o600)  # what enable left before: other users' site.py skips the file without a word
    loaded, status = users_view()
    assert loaded is False
    s = json.loads(status.stdout)
    assert status.returncode == 1 and s["healthy"] is False, "status must not call this user's start-up healthy"
    assert s["routes"]["pth"] == [{"path": str(venv.pth), "current": None, "readable": False, "mode": "0600"}]
    assert s["problems"] == [
        f"{venv.pth} is not readable by this user (mode 0600): this interpreter starts without the shim; run "
        "`te-offload-shim enable` again as the file's owner (it writes the file readable by every user)"
    ]
    assert s["routes"]["in_force"].startswith("none"), "a file this user cannot read activates nothing"
    assert status.stderr.startswith("te-offload-shim: unhealthy: ")
    owners = json.loads(venv.cli("status", "--json").stdout)  # root reads it, and is told about the others
    assert f"{venv.pth} is mode 0600: other users' interpreters skip it" in " ".join(owners["warnings"])

    # The user cannot remove root's file: one line, exit 1, no traceback
    proc = venv.cli("disable", check=False, **as_user)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"te-offload-shim disable: cannot remove {venv.pth}: Permission denied\n"

    assert venv.cli("enable").stdout.startswith(f"te-offload-shim: updated: {venv.pth}")
    assert users_view()[0] is True


# --- many writers at once ------------------------------------------------------------------------


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_enables_from_processes_with_the_same_pid_all_succeed(tmp_path: Path) -> None:
    """Containers sharing a venv volume, or nodes sharing an NFS environment: their enables may come
    from processes with the same PID (each PID namespace starts at 1)."""
    if not _unshare_works():
        pytest.skip("`unshare --pid --fork` is not allowed here (it needs root or user namespaces)")
    venv = Venv(tmp_path / "venv", sys.executable)
    go = tmp_path / "go"
    command = ["unshare", "--pid", "--fork", str(venv.python), str(RUN_FILES / "enable_worker.py"), "150", str(go)]
    workers = [
        subprocess.Popen([*command, "--remove"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        for _ in range(4)
    ]
    started = [_first_line(w) for w in workers]
    go.touch()
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        results.append(json.loads(out.splitlines()[-1]))
    assert [s["pid"] for s in started] == [1, 1, 1, 1], "each enable runs as PID 1 of its own namespace"
    assert [r["failures"] for r in results] == [[], [], [], []]
    assert venv.pth.read_text() == pth.PTH_TEXT and _mode(venv.pth) == 0o644
    leftovers = [p.name for p in venv.site.iterdir() if "te_offload_shim.pth" in p.name and p != venv.pth]
    assert leftovers == [], "no temporary file is left behind"


def test_a_link_planted_under_a_predictable_temporary_name_is_never_followed(tmp_path: Path) -> None:
    """Where others can write into the site directory (a group-writable shared environment), a link
    placed where `enable` would write its temporary file must not make it overwrite another file."""
    venv = Venv(tmp_path / "venv", sys.executable)
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    go = tmp_path / "go"
    worker = subprocess.Popen(
        [str(venv.python), str(RUN_FILES / "enable_worker.py"), "1", str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    pid = _first_line(worker)["pid"]
    (venv.site / f"{pth.PTH_NAME}.{pid}.tmp").symlink_to(victim)  # the name 0.4.0 wrote to
    go.touch()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0 and json.loads(out.splitlines()[-1])["failures"] == [], err
    assert victim.read_text() == "someone else's file\n", "enable followed the planted link"
    assert not venv.pth.is_symlink() and venv.pth.read_text() == pth.PTH_TEXT


# --- errors in one line --------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, "-m", "te_offload_shim", *args, check=False, env=_env(PYTHONPATH=str(REPO)))


@pytest.mark.parametrize("command", ["enable", "disable"])
def test_a_site_that_is_a_file_or_holds_a_folder_of_our_name_is_one_line(tmp_path: Path, command: str) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "site" / pth.PTH_NAME).mkdir(parents=True)
    verb = {"enable": "cannot read", "disable": "cannot remove"}[command]
    expected = {
        "a-file": f"{tmp_path / 'a-file'} is not a directory",
        "site": f"{verb} {tmp_path / 'site' / pth.PTH_NAME}: Is a directory",
        "missing": f"{tmp_path / 'missing'} does not exist",
    }
    for site, message in expected.items():
        proc = _cli(command, "--site", str(tmp_path / site))
        assert (proc.returncode, proc.stdout) == (1, ""), proc
        line = proc.stderr.rstrip("\n")
        assert line.startswith(f"te-offload-shim {command}: {message}") and "\n" not in line, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "site"], "nothing created"


def test_enable_and_disable_on_a_read_only_mount_are_one_line(tmp_path: Path) -> None:
    """A venv on a read-only volume (a container's read-only root file system, an NFS export
    mounted ro on the compute nodes)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / pth.PTH_NAME).write_text(pth.PTH_TEXT)
    (site / pth.PTH_NAME).chmod(0o600)  # enable must rewrite it, disable must remove it: both need to write
    script = (
        f"mount --bind {site} {site} && mount -o remount,bind,ro {site} || exit 99; "
        f"for c in enable disable; do {sys.executable} -m te_offload_shim $c --site {site}; echo rc=$?; done"
    )
    proc = _run("unshare", "--mount", "sh", "-c", script, check=False, env=_env(PYTHONPATH=str(REPO)))
    if proc.returncode == 99 or "unshare failed" in proc.stderr or "Operation not permitted" in proc.stderr:
        pytest.skip(f"no read-only bind mount here (unshare --mount): {proc.stderr.strip()[:200]}")
    path = site / pth.PTH_NAME
    assert proc.stdout.split() == ["rc=1", "rc=1"], proc
    assert proc.stderr.splitlines() == [
        f"te-offload-shim enable: cannot write {path}: Read-only file system",
        f"te-offload-shim disable: cannot remove {path}: Read-only file system",
    ]
    assert path.read_text() == pth.PTH_TEXT
