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
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._log import first_line_level, human_bytes
from te_offload_shim.engine.counters import Arming, Counters, Net, PerTarget, Table

if TYPE_CHECKING:
    from te_offload_shim.engine.states import Stats
    from te_offload_shim.te.process_globals import GivenBack
    from te_offload_shim.te.report import CacheReport

NAMES_MAX = 16  # the net's callers and undecided layers kept by name: the first 16 distinct


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
