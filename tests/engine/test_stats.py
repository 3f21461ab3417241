"""The counters' one owner (engine/stats.py), driven in-process through its own functions with the
reports the clearing paths hand it (te/report.py's `CacheReport`, te/process_globals.py's
`GivenBack`): what each count adds, what a clearing that freed something is (and the level of its
line), what a snapshot and `reset()` give; and, in fresh interpreters, when the stats file is written.

The first line's level is WARNING here (the shim's logger at WARNING, rank 0): told apart from the
INFO of TE's process globals and the DEBUG of every later line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, child_env

from te_offload_shim._log import human_bytes, logger
from te_offload_shim.engine import stats
from te_offload_shim.engine.counters import Arming, Counters
from te_offload_shim.te.process_globals import GivenBack
from te_offload_shim.te.report import CacheReport, Skipped

FIRST = logging.WARNING  # the first line's level here (the fixture below)


@pytest.fixture(autouse=True)
def _counters(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test from zero counts, the first line's level WARNING (rank 0, INFO not enabled), no stats file."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TE_OFFLOAD_SHIM_STATS", raising=False)
    level = logger.level
    logger.setLevel(logging.WARNING)
    stats.reset()
    try:
        yield
    finally:
        stats.reset()
        logger.setLevel(level)


def _freeing(**more: object) -> CacheReport:
    """A clearing that freed 3 entries of 2 layers, 300 bytes, and skipped one module with one error."""
    fields: dict[str, object] = {
        "entries": 3, "modules": 2, "bytes": 300, "skipped": [Skipped("a.b", "cuda graph")], "errors": ["x"],
    }  # fmt: skip
    fields.update(more)
    return CacheReport(**fields)  # type: ignore[arg-type]


def test_freed_is_an_entry_or_a_primary_weights_transpose_dropped() -> None:
    assert stats.freed(CacheReport(entries=1))
    assert stats.freed(CacheReport(primary_weight_cleared=64))  # no entry: the transpose has none
    assert not stats.freed(CacheReport(bytes=300, modules=2, skipped=[Skipped("a", "b")], errors=["e"]))


def test_the_primary_weights_phrase_names_the_bytes_dropped() -> None:
    report = CacheReport(primary_weight_cleared=3 * 1024 * 1024)
    assert stats.primary_weights_dropped(report) == "the transposes of FP8 primary weights (3.00 MiB)"
    assert human_bytes(report.primary_weight_cleared) in stats.primary_weights_dropped(report)


def test_a_table_clearing_adds_its_figures_to_the_table_and_its_target() -> None:
    assert stats.count_table("t", _freeing(primary_weight_cleared=64, released_bytes=500)) == FIRST
    assert stats.count_table("t", _freeing(released_bytes=None)) == logging.DEBUG  # unknown release: adds 0
    assert stats.count_table("u", _freeing(released_bytes=7)) == logging.DEBUG
    c = stats.snapshot()
    t = c.table
    assert (t.calls, t.cleared_calls, t.entries, t.modules, t.bytes) == (3, 3, 9, 6, 900)
    assert (t.skipped, t.errors, t.primary_weight_cleared, t.released_bytes) == (3, 3, 64, 507)
    per = c.targets["t"]
    assert (per.calls, per.entries, per.bytes, per.primary_weight_cleared) == (2, 6, 600, 64)
    assert (c.targets["u"].calls, c.targets["u"].entries, c.targets["u"].bytes) == (1, 3, 300)
    assert c.announced


def test_a_table_call_that_freed_nothing_counts_the_call_its_skips_and_errors_and_says_nothing() -> None:
    nothing = CacheReport(skipped=[Skipped("a", "b"), Skipped("c", "d")], errors=["e"], bytes=300, modules=2)
    assert stats.count_table("t", nothing) is None
    c = stats.snapshot()
    t = c.table
    assert (t.calls, t.cleared_calls, t.skipped, t.errors) == (1, 0, 2, 1)
    assert (t.entries, t.modules, t.bytes, t.released_bytes) == (0, 0, 0, 0)  # added only where it freed
    assert c.targets["t"].calls == 1 and c.targets["t"].bytes == 0
    assert not c.announced  # the first line is still to come
    assert stats.count_table("t", _freeing()) == FIRST


def test_the_first_clearing_of_the_process_is_said_at_the_first_lines_level_by_the_table_or_the_net() -> None:
    assert stats.count_net(_freeing(), "f.py:1 in g") == FIRST
    assert stats.count_table("t", _freeing()) == logging.DEBUG  # the net said the first
    stats.reset()
    assert stats.count_table("t", _freeing()) == FIRST
    assert stats.count_net(_freeing(), "f.py:1 in g") == logging.DEBUG


def test_the_table_keeps_the_last_calls_primary_weights_and_caching_off_figures() -> None:
    stats.count_table("t", CacheReport(primary_weight_bytes=4096, caching_off={"no-cache": 2}))
    c = stats.snapshot()
    assert c.table.primary_weight_bytes == 4096 and c.caching_off == {"no-cache": 2}
    assert c.targets["t"].caching_off == {"no-cache": 2}  # why its last call cleared nothing
    stats.count_table("t", _freeing(primary_weight_bytes=1024, caching_off={"other": 1}))
    c = stats.snapshot()
    assert c.table.primary_weight_bytes == 1024 and c.caching_off == {"other": 1}
    assert c.targets["t"].caching_off == {}  # its last call freed something: no zero to explain


def test_the_table_keeps_a_copy_of_the_reports_caching_off() -> None:
    report = CacheReport(caching_off={"no-cache": 1})
    stats.count_table("t", report)
    report.caching_off["later"] = 5  # the report's dict, changed after it was counted
    c = stats.snapshot()
    assert c.caching_off == {"no-cache": 1} and c.targets["t"].caching_off == {"no-cache": 1}


def test_a_zero_that_caching_off_explains_is_said_once_per_reason() -> None:
    assert stats.count_table("t", CacheReport(caching_off={"a": 1})) == FIRST
    assert stats.count_table("t", CacheReport(caching_off={"a": 3})) == logging.DEBUG
    assert stats.count_table("u", CacheReport(caching_off={"a": 1, "b": 1})) == FIRST  # a new reason
    assert stats.count_table("u", CacheReport(caching_off={"b": 1})) == logging.DEBUG
    assert stats.snapshot().said_off == {"a", "b"}
    assert not stats.snapshot().announced  # no clearing said yet: those were zeros explained


def test_a_net_clearing_counts_its_figures_and_its_first_sixteen_callers() -> None:
    callers = [f"f.py:{i} in g" for i in range(20)]
    for caller in callers:
        stats.count_net(_freeing(primary_weight_cleared=8), caller)
    stats.count_net(_freeing(), callers[0])  # a caller seen again is kept once
    assert stats.count_net(CacheReport(errors=["e"]), "h.py:1 in k") is None  # freed nothing: no caller
    net = stats.snapshot().net
    assert (net.cleared_flushes, net.entries, net.modules, net.bytes) == (21, 63, 42, 6300)
    assert (net.primary_weight_cleared, net.skipped, net.errors, net.flushes) == (160, 21, 22, 0)
    assert net.callers == dict.fromkeys(callers[: stats.NAMES_MAX])
    assert stats.NAMES_MAX == 16


def test_flushes_seen_and_the_nets_own_failures_are_counted() -> None:
    stats.flush_seen()
    stats.flush_seen()
    stats.net_failed()
    stats.net_failed()
    stats.flush_seen()
    net = stats.snapshot().net
    assert (net.flushes, net.errors) == (3, 2)


def test_undecided_layers_are_counted_at_each_flush_and_the_first_sixteen_named() -> None:
    names = [f"Linear{i}.weight" for i in range(18)]
    stats.undecided(names[:2])
    stats.undecided(names[:2])  # the same two again: counted, named once
    stats.undecided(names)
    net = stats.snapshot().net
    assert net.undecided == 22
    assert net.undecided_names == dict.fromkeys(names[: stats.NAMES_MAX])


def test_the_nets_arming_figures_are_kept_and_outlive_a_reset() -> None:
    stats.net_armed(5, 2)
    assert stats.snapshot().arming == Arming(found=5, frozen_not_searched=2)
    stats.flush_seen()
    stats.reset()
    assert stats.snapshot() == Counters(arming=Arming(5, 2))  # every count back to zero, the figures kept
    assert stats.counts()["net"]["frozen_not_searched"] == 2


def test_a_clearing_that_failed_open_counts_an_error_for_the_table_and_the_target_with_the_latest_why() -> None:
    stats.clearing_failed("t", "first")
    stats.clearing_failed("t", "second")
    stats.clearing_failed("u", "other")
    c = stats.snapshot()
    assert c.table.errors == 3 and c.table.calls == 0
    assert (c.targets["t"].failed, c.targets["t"].failed_why) == (2, "second")
    assert (c.targets["u"].failed, c.targets["u"].failed_why) == (1, "other")


def test_calls_left_alone_are_counted_by_target_and_reason() -> None:
    stats.left_alone("t", "colocated")
    stats.left_alone("t", "colocated")
    stats.left_alone("t", "graphs")
    stats.left_alone("u", "graphs")
    c = stats.snapshot()
    assert c.targets["t"].left_alone == {"colocated": 2, "graphs": 1}
    assert c.targets["u"].left_alone == {"graphs": 1}
    assert stats.counts()["left_alone"] == {"t": {"colocated": 2, "graphs": 1}, "u": {"graphs": 1}}


def test_tes_process_globals_given_back_are_summed_the_first_said_at_info_and_those_kept_counted_by_reason() -> None:
    assert stats.count_te_globals(GivenBack(kept="cuda graphs")) is None
    assert stats.count_te_globals(GivenBack(kept="cuda graphs")) is None
    assert stats.count_te_globals(GivenBack(entries=2, bytes=200)) == logging.INFO  # the first given back
    assert stats.count_te_globals(GivenBack(entries=1, bytes=50)) == logging.DEBUG
    assert stats.count_te_globals(GivenBack(kept="other")) is None
    kept = {"cuda graphs": 2, "other": 1}
    assert stats.counts()["te_globals"] == {"calls": 2, "entries": 3, "bytes": 250, "kept": kept}


def test_each_audit_is_numbered_and_kept_as_the_latest_the_first_said_at_the_first_lines_level() -> None:
    assert stats.count_audit({"before": 1}) == FIRST
    assert stats.count_audit({"before": 2}) == logging.DEBUG
    assert stats.counts()["audit"] == {"before": 2, "audits": 2}
    assert stats.snapshot().audits == 2


def test_a_snapshot_is_a_copy_and_counts_are_its_plain_data() -> None:
    stats.count_table("t", _freeing(released_bytes=10))
    taken = stats.snapshot()
    taken.table.calls = 99
    taken.targets["t"].calls = 99
    assert stats.snapshot().table.calls == 1 and stats.snapshot().targets["t"].calls == 1
    data = stats.counts()
    assert (data["calls"], data["cleared_calls"], data["entries"], data["released_bytes"]) == (1, 1, 3, 10)
    assert data["by_target"] == {"t": {"calls": 1, "entries": 3, "bytes": 300, "primary_weight_cleared": 0}}


def _run_counting(tmp_path: Path, what: str, *, file: bool = True) -> tuple[dict[str, bool], dict[str, Any] | None]:
    """tests/run_files/stats_counting.py in a fresh interpreter, with a stats file asked for (rank 3)
    or none: what it said before it exited, and the file it left (None for none)."""
    path = tmp_path / "stats.json"
    script = REPO / "tests" / "run_files" / "stats_counting.py"
    env = child_env({"TE_OFFLOAD_SHIM_STATS": str(path), "RANK": "3"} if file else {})
    proc = subprocess.run([sys.executable, script, what], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.splitlines()[-1])
    return said, json.loads(path.read_text()) if path.exists() else None


COUNTED = ["freed", "table", "flush", "failed", "left-alone"]  # an offload or a flush counted
NOT_COUNTED = ["nothing", "net-failed", "undecided", "te-globals", "audit"]


@pytest.mark.parametrize("what", COUNTED)
def test_a_process_that_counted_writes_the_stats_file_at_exit_and_at_once_after_a_clearing_that_freed(
    tmp_path: Path, what: str
) -> None:
    """The file is written after a clearing that freed something, and at exit in a process that
    counted anything (its last calls may have freed nothing); the exit write is the last counts."""
    said, after = _run_counting(tmp_path, what)
    assert said["existed"] is (what == "freed")
    assert after is not None and after["rank"] == "3"
    calls = {"freed": 2, "table": 1}.get(what, 0)
    assert after["calls"] == calls and after["net"]["flushes"] == (what == "flush")


@pytest.mark.parametrize("what", NOT_COUNTED)
def test_a_process_that_counted_no_offload_or_flush_writes_no_stats_file(tmp_path: Path, what: str) -> None:
    """A process that never offloaded (a tokenizer worker, the CLI), whatever else it counted, writes no file."""
    said, after = _run_counting(tmp_path, what)
    assert not said["existed"] and after is None


@pytest.mark.parametrize("what", COUNTED + NOT_COUNTED)
def test_without_a_stats_file_asked_for_its_writer_is_never_loaded(tmp_path: Path, what: str) -> None:
    said, after = _run_counting(tmp_path, what, file=False)
    assert not said["writer loaded"] and after is None
