"""The stats file's writer (engine/stats_file.py) as careful as the `.pth` writer: its temporary file
is made exclusively and never through a link planted at its name, and it is removed on every failure
(a full disk included); the write never raises into the offload."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, child_env

from te_offload_shim import _log
from te_offload_shim.engine import stats, stats_file


def _write(path: Path) -> list[str]:
    """One write of the stats file at `path`; the shim's log lines it gave."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger, handler = logging.getLogger("te_offload_shim"), Keep()
    logger.addHandler(handler)
    os.environ["TE_OFFLOAD_SHIM_STATS"] = str(path)
    try:
        stats_file.write(stats.counts)
    finally:
        del os.environ["TE_OFFLOAD_SHIM_STATS"]
        logger.removeHandler(handler)
    return said


def test_a_link_planted_where_the_temporary_file_goes_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where others can write into the stats folder (a shared scratch file system), a link planted
    under the temporary file's name must not make the write go through it: the name the writer
    picks (its random part fixed here, so that the link can be planted there) and the name 0.7.0
    wrote to. The write fails in one warning, the victim and the planted links stay as they were,
    and the next write, under a name of its own, lands."""
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    path = tmp_path / "stats.json"
    monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
    planted = [
        tmp_path / f"stats.json.{os.getpid()}.{'01' * 6}.tmp",
        tmp_path / f"stats.json.{os.getpid()}.{threading.get_ident()}.tmp",  # 0.7.0's name
    ]
    for link in planted:
        link.symlink_to(victim)
    _log._warned.discard("stats-file:FileExistsError")
    said = _write(path)
    assert victim.read_text() == "someone else's file\n", "the write followed a planted link"
    assert len(said) == 1 and "cannot write" in said[0] and "FileExistsError" in said[0], said
    assert all(link.is_symlink() for link in planted) and not path.exists(), "nothing of ours, nothing taken"
    monkeypatch.undo()
    assert _write(path) == [] and json.loads(path.read_text())["calls"] == stats.counts()["calls"]
    assert victim.read_text() == "someone else's file\n"


def test_a_write_that_fails_after_its_temporary_file_was_made_removes_it(tmp_path: Path) -> None:
    """The stats path is a folder (a typo, `{rank}/` left out): the temporary file is written, the
    rename fails, and the temporary file goes with the failure (0.7.0 left it there)."""
    path = tmp_path / "stats.json"
    path.mkdir()
    _log._warned.discard("stats-file:IsADirectoryError")
    said = _write(path)
    assert len(said) == 1 and "IsADirectoryError" in said[0], said
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"] and list(path.iterdir()) == []


def _unshare_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_full_disk_leaves_no_temporary_file_and_is_said_once(tmp_path: Path) -> None:
    """ENOSPC, for real: a 64 KiB tmpfs in a mount namespace of its own (`unshare --mount`, root),
    filled to the last block. Each write fails (one warning for both), and leaves nothing: 0.7.0
    left a 0-byte `<path>.<pid>.<tid>.tmp`. Once there is room again, the file is written."""
    if not _unshare_mount_works():
        pytest.skip("`unshare --mount` is not allowed here (it needs root)")
    folder = tmp_path / "full"
    folder.mkdir()
    script = REPO / "tests" / "run_files" / "stats_full_disk.py"
    command = f"mount -t tmpfs -o size=64k tmpfs {folder} || exit 99; exec {sys.executable} {script} {folder}"
    proc = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command],
        capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO,
    )  # fmt: skip
    if proc.returncode == 99:
        pytest.skip(f"no tmpfs mount here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["full"] == ["filler"], "no temporary file left on the full disk"
    assert len(seen["said"]) == 1 and "No space left on device" in seen["said"][0], seen["said"]
    assert seen["after"] == ["stats.json"], "written once there is room"
