"""The operators' view (issue 36): `status --strict` as a gate, bad switch values in `warnings`,
`--json` rows that are `status()`'s rows, a job's stats files summed, and a CLI that is never
silent: a command that left (`discover`), a closed pipe, a read-only site with nothing to disable,
the version."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, child_env
from support import stats_rank

TARGETS = REPO / "tests" / "hostile" / "targets"
SHIM = [sys.executable, "-m", "te_offload_shim"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHIM, *args], capture_output=True, text=True, env=child_env(env), cwd=REPO, timeout=180)


def test_strict_fails_without_an_activation_route_and_passes_under_run() -> None:
    plain = _cli("status")
    assert plain.returncode == 0 and plain.stdout.splitlines()[-1] == "healthy", "plain status stays informative"
    gate = _cli("status", "--strict")
    assert gate.returncode == 1
    assert gate.stderr.startswith("te-offload-shim: --strict: no activation route is in force for this interpreter")
    under_run = _cli("run", "--", *SHIM, "status", "--strict", "--json")
    report = json.loads(under_run.stdout)
    assert under_run.returncode == 0, under_run.stderr
    assert report["routes"]["in_force"] == "sitecustomize bootstrap" and report["strict_failures"] == []


def test_bad_switch_values_are_warnings_in_text_and_json_and_fail_the_gate() -> None:
    env = {"TE_OFFLOAD_SHIM": "maybe", "TE_OFFLOAD_SHIM_DISABLE": "verll"}
    report = json.loads(_cli("status", "--json", env=env).stdout)
    assert report["schema_version"] == 2 and report["healthy"] is True
    assert report["warnings"][0] == "TE_OFFLOAD_SHIM='maybe' is not 1/0 (true/false, yes/no, on/off); it stays on"
    assert report["warnings"][1].startswith("TE_OFFLOAD_SHIM_DISABLE names 'verll', which is no target (known: verl,")
    assert [f"warning: {w}" for w in report["warnings"]] == report["strict_failures"][1:]
    text = _cli("status", env=env).stdout.splitlines()
    assert f"warning: {report['warnings'][0]}" in text and f"warning: {report['warnings'][1]}" in text
    assert _cli("run", "--", *SHIM, "status", "--strict", env=env).returncode == 1


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"})
def test_json_rows_are_status_rows_with_what_is_installed() -> None:
    import te_offload_shim

    sys.path.insert(0, str(TARGETS))
    import shim_targets  # noqa: F401  # imported: patched

    from te_offload_shim import health
    from te_offload_shim.engine.states import TargetRow

    rows = {r["name"]: r for r in health.collect()["targets"]}
    for row in te_offload_shim.status()["targets"]:
        assert {k: rows[row["name"]][k] for k in TargetRow.__annotations__} == row
    assert rows["shim_targets:offload"]["state"] == "patched" and rows["shim_targets:offload"]["layers"] == 1


def test_two_ranks_stats_files_are_written_at_exit_and_summed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TE_OFFLOAD_SHIM_TARGETS", "shim_targets:offload")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_STATS", str(tmp_path / "stats-{rank}.json"))
    spawn = multiprocessing.get_context("spawn")
    for rank, clearings in (("0", 1), ("1", 2)):
        process = spawn.Process(target=stats_rank.one_rank, args=(rank, clearings))
        process.start()
        process.join(120)
        assert process.exitcode == 0
    files = sorted(str(p) for p in tmp_path.iterdir())
    assert [Path(f).name for f in files] == ["stats-0.json", "stats-1.json"], "one file per rank, no temporary left"
    assert [json.loads(Path(f).read_text())["calls"] for f in files] == [2, 3], "the last, empty call: at exit"
    proc = _cli("stats", *files)
    total = json.loads(proc.stdout)
    assert proc.returncode == 0 and total["processes"] == 2
    assert (total["calls"], total["cleared_calls"], total["entries"]) == (5, 3, 3)
    assert total["by_target"]["shim_targets:offload"]["entries"] == 3 and total["net"]["flushes"] == 0
    missing = _cli("stats", files[0], str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "list.json").write_text("[1, 2]")  # JSON, but no stats file: a line, not a traceback
    not_stats = _cli("stats", files[0], str(tmp_path / "list.json"))
    assert not_stats.returncode == 2 and not_stats.stderr.startswith("te-offload-shim stats: cannot read"), not_stats


def test_ranks_only_torch_distributed_knows_write_one_file_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned ranks (world size 2, gloo) whose rank comes only from `init_process_group(rank=...)`
    clear, destroy the process group and exit: one file per process, named by the rank known at its
    first write, which its `rank` says; `stats` sums 2 processes. (The exit write, after
    `destroy_process_group()`, went to a second `...-none.json`, and `stats` summed 4 processes.) A
    process that never knew its rank says so in its file (`rank` null)."""
    monkeypatch.setenv("TE_OFFLOAD_SHIM_TARGETS", "shim_targets:offload")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_STATS", str(tmp_path / "stats" / "stats-{rank}.json"))
    (tmp_path / "stats").mkdir()
    spawn = multiprocessing.get_context("spawn")
    store = str(tmp_path / "store")
    ranks = [spawn.Process(target=stats_rank.one_torch_rank, args=(rank, 2, store, rank + 1)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(180)
    assert [process.exitcode for process in ranks] == [0, 0]
    files = sorted(str(p) for p in (tmp_path / "stats").iterdir())
    assert [Path(f).name for f in files] == ["stats-0.json", "stats-1.json"], "one file per process"
    documents = [json.loads(Path(f).read_text()) for f in files]
    assert [(d["rank"], d["calls"], d["cleared_calls"]) for d in documents] == [("0", 2, 1), ("1", 3, 2)], documents
    proc = _cli("stats", *files)
    total = json.loads(proc.stdout)
    assert proc.returncode == 0 and (total["processes"], total["ranks"]) == (2, ["0", "1"]), proc
    assert (total["calls"], total["cleared_calls"], total["entries"]) == (5, 3, 3), total

    monkeypatch.setenv("TE_OFFLOAD_SHIM_STATS", str(tmp_path / "alone-{rank}.json"))
    monkeypatch.delenv("RANK", raising=False)
    alone = spawn.Process(target=stats_rank.one_rank, args=(None, 1))
    alone.start()
    alone.join(120)
    assert alone.exitcode == 0
    assert json.loads((tmp_path / "alone-none.json").read_text())["rank"] is None, "never known, said in the file"


_NOT_STATS: dict[str, bytes | None] = {
    "nested past json's reach": b"[" * 100_000,  # json.load raises RecursionError
    "nested within it": b'{"net": ' * 950 + b"1" + b"}" * 950,  # json reads it; summing must not follow it
    "a string where a number is": b'{"calls": "3"}',
    "an array in an object": b'{"by_target": {"verl": [1, 2]}}',
    "a boolean": b'{"calls": true}',
    "binary junk": bytes(range(256)) * 4,
    "empty": b"",
    "an integer of 5000 digits": b'{"calls": ' + b"9" * 5000 + b"}",
    "an object where the other file has a number": b'{"net": 3}',
    "a folder": None,
}


@pytest.mark.parametrize("case", list(_NOT_STATS))
def test_stats_answers_any_file_that_is_no_stats_file_in_one_line(tmp_path: Path, case: str) -> None:
    """`te-offload-shim stats GOOD BAD`, whatever BAD holds: one line on stderr, exit 2, nothing on
    stdout, never a traceback (nesting raised RecursionError through, and wrong types were summed as
    nothing, exit 0)."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"calls": 1, "net": {"flushes": 2}, "rank": "0"}))
    bad = tmp_path / "bad.json"
    content = _NOT_STATS[case]
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    proc = _cli("stats", str(good), str(bad))
    lines = proc.stderr.splitlines()
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    assert len(lines) == 1 and lines[0].startswith("te-offload-shim stats: cannot "), proc.stderr
    assert "Traceback" not in proc.stderr


def test_stats_files_written_by_threads_at_once_are_always_whole(tmp_path: Path) -> None:
    """A wrapped offload and a flush on two threads write the stats file at once: each write has a
    temporary file of its own (they shared one, and one thread's `os.replace` took the other's)."""
    import threading

    from te_offload_shim.engine import stats, stats_file

    path = tmp_path / "stats.json"
    errors: list[str] = []
    os.environ["TE_OFFLOAD_SHIM_STATS"] = str(path)
    try:
        with _warnings_to(errors):

            def writes() -> None:
                for _ in range(200):
                    stats_file.write(stats.counts)

            threads = [threading.Thread(target=writes) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        del os.environ["TE_OFFLOAD_SHIM_STATS"]
    assert errors == [] and json.loads(path.read_text())["calls"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"], "no temporary file left"


def test_a_stats_file_that_cannot_be_written_is_said_once_and_never_raised(tmp_path: Path) -> None:
    """A stats file in a folder that does not exist (or on a full disk) costs one warning: the
    write, run after a clearing and at exit, never raises, strict mode included (it is a report);
    the warning says the exception as text."""
    from te_offload_shim import _log
    from te_offload_shim.engine import stats, stats_file

    said: list[str] = []
    os.environ["TE_OFFLOAD_SHIM_STATS"] = str(tmp_path / "missing" / "stats.json")
    os.environ["TE_OFFLOAD_SHIM_STRICT"] = "1"
    _log._warned.discard("stats-file:FileNotFoundError")
    try:
        with _warnings_to(said):
            stats_file.write(stats.counts)
            stats_file.write(stats.counts)
    finally:
        del os.environ["TE_OFFLOAD_SHIM_STATS"], os.environ["TE_OFFLOAD_SHIM_STRICT"]
    assert len(said) == 1 and "cannot write" in said[0] and "FileNotFoundError: " in said[0], said


def test_strict_fails_where_only_pythonstartup_would_activate_it() -> None:
    """PYTHONSTARTUP runs in interactive sessions only: `python train.py` gets no shim from it."""
    from te_offload_shim.activation import pth

    gate = _cli("status", "--strict", env={"PYTHONSTARTUP": pth.STARTUP_FILE})
    assert gate.returncode == 1 and "no activation route is in force" in gate.stderr, gate


def test_strict_fails_where_a_present_target_would_not_be_patched() -> None:
    """What leaves a target present here unpatched (not switched off by name, not fixed upstream) is
    the switch `TE_OFFLOAD_SHIM=0`: the gate fails, saying so, with a route in force."""
    env = {"TE_OFFLOAD_SHIM": "0"}
    gate = _cli("run", "--", *SHIM, "status", "--strict", "--json", env=env)
    report = json.loads(gate.stdout)
    unpatched = [r for r in report["targets"] if r["present"] and not r["would_be_patched"] and not r["disabled"]]
    assert unpatched and report["routes"]["in_force"] == "sitecustomize bootstrap", report["routes"]
    assert gate.returncode == 1 and report["strict_failures"] == [
        "warning: switched off by TE_OFFLOAD_SHIM=0: nothing is patched"
    ], report["strict_failures"]
    assert gate.stderr.startswith("te-offload-shim: --strict: warning: switched off by TE_OFFLOAD_SHIM=0")


@contextlib.contextmanager
def _warnings_to(said: list[str]) -> Any:
    """The shim's log records, as text, into `said` (a handler on its logger)."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger, handler = logging.getLogger("te_offload_shim"), Keep()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def test_a_closed_pipe_ends_quietly() -> None:
    """`status --all | head -3` under pipefail: the reader is gone before the report is written."""
    command = f"set -o pipefail; {' '.join(SHIM)} status --all --json | true"
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("args", [(), ("--json", "/some/path"), ("--help",), ("-v", "--all")])
def test_discover_says_in_one_line_where_it_went_whatever_follows(args: tuple[str, ...]) -> None:
    """`discover` left the package in 0.7.0: an old command line, options and all, is told where to
    look now (exit 2), not given argparse's "invalid choice" or "unrecognized arguments"."""
    proc = _cli("discover", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("te-offload-shim discover: gone since 0.7.0: the flush net"), lines
    assert "`status`'s net row" in lines[0] and "scripts/discover.py" in lines[0]


def test_disable_with_nothing_to_remove_on_a_read_only_mount(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only file system")
    mount = 'mount -t tmpfs -o ro none "$0" && exec "$@"'
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, str(site), *SHIM, "disable", "--site", str(site)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
    )
    if "mount" in proc.stderr or "unshare" in proc.stderr:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
    assert (proc.returncode, proc.stdout) == (0, f"te-offload-shim: already disabled: {site}/te_offload_shim.pth\n")


def test_run_says_when_the_commands_python_has_no_wrapt(tmp_path: Path) -> None:
    """A venv that sees this checkout but not wrapt: the shim starts there and can patch nothing."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path)], check=True)
    (site,) = tmp_path.glob("lib/python3.*/site-packages")
    (site / "checkout.pth").write_text(f"{REPO}\n")
    python = str(tmp_path / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    proc = subprocess.run([*SHIM, "run", "--", python, "-V"], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.startswith("Python 3."), "the command runs, unchanged"
    assert (
        proc.stderr
        == f"te-offload-shim run: {python} has no wrapt: nothing is patched; the command runs without the shim\n"
    )
