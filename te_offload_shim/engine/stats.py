"""What the shim counted in this process, in one place: the table's counters (each wrapped offload),
the flush net's, TE's process globals given back and the audits, with the one rule for a clearing
that freed something (counted, said at the first line's level, the stats file written). This module
is their one owner: engine/handler.py and engine/net.py count through the functions below, te/ and
reports/ return their figures in their reports, which are added up here. `status()` reads a
`snapshot`; `stats()` as plain data (`counts`) and the stats file (`TE_OFFLOAD_SHIM_STATS`) that
carries it out of the process are engine/stats_file.py's, loaded only where one of them is asked
for. Standard library and the package's ground floor only: `status()` loads this module without
loading what clears.

A reload of this module starts its counts afresh, as `reset()` does (docs/guarantees.md, "What a
reload keeps").
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._log import first_line_level, human_bytes

if TYPE_CHECKING:
    from te_offload_shim.engine.states import Stats
    from te_offload_shim.te.process_globals import GivenBack
    from te_offload_shim.te.report import CacheReport

NAMES_MAX = 16  # the net's callers and undecided layers kept by name: the first 16 distinct


@dataclass
class Clearings:
    """What clearings freed, the table's or the net's (each group has its own)."""

    entries: int = 0  # cache entries cleared
    modules: int = 0  # TE layers whose caches were cleared
    bytes: int = 0  # bytes those entries held (each storage once)
    primary_weight_cleared: int = 0  # bytes of FP8 primary weights' transposes dropped (they have no entry)
    skipped: int = 0  # modules or chunks left alone (CUDA graphs, TE < 1.8 layout, ...)
    errors: int = 0  # the shim's own errors (each also logged once)


@dataclass
class Table(Clearings):
    calls: int = 0  # wrapped offload calls
    cleared_calls: int = 0  # of those, calls that freed something
    released_bytes: int = 0  # allocator bytes released by the clearing (CUDA only)
    primary_weight_bytes: int = 0  # FP8 primary weights' copies left in place at the last call (a figure)


@dataclass
class Net(Clearings):
    flushes: int = 0  # allocator flushes the net saw (while on)
    cleared_flushes: int = 0  # of those, flushes before which it freed something
    undecided: int = 0  # TE layers it could not decide at a flush (summed over flushes): left alone
    callers: dict[str, None] = field(default_factory=dict)  # "file:line in function" of clearing flushes
    undecided_names: dict[str, None] = field(default_factory=dict)  # "Class.parameter" of those layers


@dataclass
class Arming:
    """Figures of the net's arming, not counts: `reset()` keeps them."""

    found: int = 0  # layers built before the net armed, found then
    frozen_not_searched: int = 0  # objects frozen by gc.freeze() then: not searched for layers


@dataclass
class PerTarget:
    calls: int = 0
    entries: int = 0
    bytes: int = 0
    primary_weight_cleared: int = 0
    left_alone: dict[str, int] = field(default_factory=dict)  # the reason its skip rule gave -> calls
    caching_off: dict[str, int] = field(default_factory=dict)  # at its last call, when that freed nothing
    failed: int = 0  # calls whose clearing failed open (the offload went on without it)
    failed_why: str = ""  # why the latest did


@dataclass
class GlobalsGiven:
    """TE_OFFLOAD_SHIM_TE_GLOBALS: TE's process globals given back, and kept ({reason: calls})."""

    calls: int = 0
    entries: int = 0
    bytes: int = 0
    kept: dict[str, int] = field(default_factory=dict)


@dataclass
class Counters:
    """Every counter of the process: the one state this module owns (`_c`)."""

    table: Table = field(default_factory=Table)
    net: Net = field(default_factory=Net)
    arming: Arming = field(default_factory=Arming)
    targets: dict[str, PerTarget] = field(default_factory=dict)
    caching_off: dict[str, int] = field(default_factory=dict)  # TE layers caching nothing at the last call, by reason
    te_globals: GlobalsGiven = field(default_factory=GlobalsGiven)
    audits: int = 0
    audit: dict[str, Any] | None = None  # the latest TE_OFFLOAD_SHIM_AUDIT report
    announced: bool = False  # the first clearing (table or net) has been said
    said_off: set[str] = field(default_factory=set)  # the caching-off reasons said at the first line's level


_lock = Lock()
_c = Counters()
_exit_write: list[object] = []  # the stats file's writer at exit, once registered


# --- the one rule of a clearing that freed something ----------------------------------------------


def freed(report: CacheReport) -> bool:
    """Whether a clearing freed something: a workspace entry, or an FP8 primary weight's transpose
    (which has no entry). Such a clearing is counted, said (the first of the process at the first
    line's level) and written to the stats file, whichever path cleared it."""
    return bool(report.entries or report.primary_weight_cleared)


def primary_weights_dropped(report: CacheReport) -> str:
    """How both paths' lines say the FP8 primary weights' transposes a clearing dropped."""
    return f"the transposes of FP8 primary weights ({human_bytes(report.primary_weight_cleared)})"


def _clearing(group: Table | Net, report: CacheReport) -> int | None:
    """Add one clearing's report to `group`, under `_lock`; returns the level of its line: the
    first clearing of the process, by the table or the net, at `first_line_level()` (seen once per
    job), every later one at DEBUG; None (no line) for one that freed nothing."""
    group.skipped += len(report.skipped)
    group.errors += len(report.errors)
    if not freed(report):
        return None
    group.entries += report.entries
    group.modules += report.modules
    group.bytes += report.bytes
    group.primary_weight_cleared += report.primary_weight_cleared
    first, _c.announced = not _c.announced, True
    return first_line_level() if first else logging.DEBUG


def _written_if_freed(report: CacheReport) -> None:
    """After each clearing that freed something: the stats file, where one is asked for. (The writer
    is handed `counts`: it reads the counters through it, never importing this module.)"""
    if freed(report) and os.environ.get(_switches.STATS):
        from te_offload_shim.engine import stats_file  # loaded only where the file is asked for

        stats_file.write(counts)


def _counting() -> None:
    """The stats file is written at exit too, in a process that counted anything (a wrapped call, a
    flush the net saw): its last calls may have freed nothing, and a process that never offloaded
    (a tokenizer worker, the CLI) writes no file."""
    if not _exit_write and os.environ.get(_switches.STATS):
        from te_offload_shim.engine import stats_file

        _exit_write.append(stats_file.write_at_exit(counts))


# --- counting -------------------------------------------------------------------------------------


def count_table(name: str, report: CacheReport) -> int | None:
    """Count one wrapped call's clearing; returns the level of its line, None for no line."""
    _counting()
    with _lock:
        table, per = _c.table, _c.targets.setdefault(name, PerTarget())
        table.calls += 1
        per.calls += 1
        table.primary_weight_bytes = report.primary_weight_bytes
        _c.caching_off = dict(report.caching_off)
        level = _clearing(table, report)
        # why the target's last call cleared nothing, if it freed nothing
        per.caching_off = dict(report.caching_off) if level is None else {}
        if level is not None:
            table.cleared_calls += 1
            table.released_bytes += report.released_bytes or 0
            per.entries += report.entries
            per.bytes += report.bytes
            per.primary_weight_cleared += report.primary_weight_cleared
        elif report.caching_off:  # a 0 that is no clearing's doing says why, once per reason
            new = not _c.said_off.issuperset(report.caching_off)
            _c.said_off.update(report.caching_off)
            level = first_line_level() if new else logging.DEBUG
    _written_if_freed(report)
    return level


def count_net(report: CacheReport, caller: str) -> int | None:
    """Count one clearing of the flush net; returns the level of its line, None when it freed nothing."""
    _counting()
    with _lock:
        level = _clearing(_c.net, report)
        if level is None:
            return None
        _c.net.cleared_flushes += 1
        if len(_c.net.callers) < NAMES_MAX:
            _c.net.callers.setdefault(caller, None)
    _written_if_freed(report)
    return level


def flush_seen() -> None:
    _counting()
    with _lock:
        _c.net.flushes += 1


def net_failed() -> None:
    """The net's own failure at a flush (said once by the net)."""
    with _lock:
        _c.net.errors += 1


def undecided(names: list[str]) -> None:
    """TE layers the net could not decide at one flush (an empty weight on the device: a reshard or
    an offload that marked nothing, no telling which), named `Class.parameter`: left alone, counted."""
    with _lock:
        _c.net.undecided += len(names)
        for name in names:
            if len(_c.net.undecided_names) < NAMES_MAX:  # as the callers: the first distinct ones
                _c.net.undecided_names.setdefault(name, None)


def net_armed(found: int, frozen: int) -> None:
    """The figures of the net's arming: layers found then, objects frozen then (not searched)."""
    with _lock:
        _c.arming = Arming(found, frozen)


def clearing_failed(name: str, why: str) -> None:
    """A call of target `name` whose clearing failed open (the offload went on without it)."""
    _counting()
    with _lock:
        _c.table.errors += 1
        per = _c.targets.setdefault(name, PerTarget())
        per.failed += 1
        per.failed_why = why


def left_alone(name: str, reason: str) -> None:
    _counting()
    with _lock:
        per = _c.targets.setdefault(name, PerTarget()).left_alone
        per[reason] = per.get(reason, 0) + 1


def count_te_globals(given: GivenBack) -> int | None:
    """What TE_OFFLOAD_SHIM_TE_GLOBALS gave back at one offload (te/process_globals.py's figures);
    returns the level of its line (the first at INFO), None where it kept them (counted by reason)."""
    with _lock:
        totals = _c.te_globals
        if given.kept is not None:
            totals.kept[given.kept] = totals.kept.get(given.kept, 0) + 1
            return None
        first = totals.calls == 0
        totals.calls += 1
        totals.entries += given.entries
        totals.bytes += given.bytes
    return logging.INFO if first else logging.DEBUG


def count_audit(report: dict[str, Any]) -> int:
    """One TE_OFFLOAD_SHIM_AUDIT report (reports/audit.py's, plain data): numbered and kept as the
    latest; returns the level of its line, the first clearing's rule (seen once per job)."""
    with _lock:
        _c.audits += 1
        _c.audit = {**report, "audits": _c.audits}
        first = _c.audits == 1
    return first_line_level() if first else logging.DEBUG


# --- reading --------------------------------------------------------------------------------------


def snapshot() -> Counters:
    """Every counter as it is now (a copy): what `status()` reads, and `counts` hands on."""
    with _lock:
        return copy.deepcopy(_c)


def counts() -> Stats:
    """`stats()`: every counter, as plain data (engine/stats_file.py builds it from a snapshot)."""
    from te_offload_shim.engine import stats_file  # loaded by stats() and the stats file only

    return stats_file.as_stats(snapshot())


def reset() -> None:
    """Every count back to zero; the figures of the net's arming stay (they are no count)."""
    global _c
    with _lock:
        _c = Counters(arming=_c.arming)
