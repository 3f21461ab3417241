"""What the shim counted in this process, in one place: the table's counters (each wrapped offload),
the flush net's, and the one rule for the line that proves the shim worked. This module is their one
owner.

engine/handler.py and engine/net.py count through these functions; `status()` and `stats()` read
them here (`counts`). `stats()` as a whole (with TE's globals and the latest audit) and the stats
file (`TE_OFFLOAD_SHIM_STATS`) that carries it out of the process are engine/stats_file.py's, loaded
only when one of them is asked for: a process with no stats file never loads it. Standard library
and the package's ground floor only: `status()` loads it without loading what clears.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._log import first_line_level
from te_offload_shim._reload import kept

if TYPE_CHECKING:
    from te_offload_shim.engine.states import NetTotals
    from te_offload_shim.te.report import CacheReport

TABLE = ("calls", "cleared_calls", "entries", "modules", "bytes", "released_bytes", "skipped", "errors")
NET = ("flushes", "cleared_flushes", "entries", "modules", "bytes", "primary_weight_cleared", "skipped", "errors")
# and `frozen_not_searched`, set once when the net arms (`set_net`)


def _zero() -> dict[str, Any]:
    return {
        "table": dict.fromkeys((*TABLE, "primary_weight_bytes"), 0),
        "net": dict.fromkeys((*NET, "frozen_not_searched"), 0),
        "by_target": {},
        "left_alone": {},  # target -> the reason its skip rule gave -> calls left alone
        "caching_off": {},  # TE layers whose caching is off by configuration, by reason, at the last call
        "caching_off_by_target": {},  # the same per target, at its last call if that cleared nothing
        "callers": {},  # the net's: "file:line in function" of flushes that cleared something, first 16
        "announced": False,  # the first clearing (table or net) has been said
        "said_off": set(),  # the caching-off reasons said at the first line's level
    }


# Kept by a reload of this module (`kept`), like every counter of the package.
_lock = kept(globals(), "_lock", Lock)
_c: dict[str, Any] = kept(globals(), "_c", _zero)
_at_exit: list[object] = kept(globals(), "_at_exit", list)  # the stats file's writer, once registered


def _counting() -> None:
    """The stats file is written at exit too, in a process that counted anything (a wrapped call, a
    flush the net saw): its last calls may have cleared nothing, and a process that never offloaded
    (a tokenizer worker, the CLI) writes no file."""
    if not _at_exit and os.environ.get(_switches.STATS):
        from te_offload_shim.engine import stats_file  # loaded only where the file is asked for

        _at_exit.append(stats_file.write_at_exit(counts))


def _write_file() -> None:
    """After each clearing that cleared something: the stats file, where one is asked for. (The
    writer is handed `counts`: it reads the counters through it, never importing this module.)"""
    if os.environ.get(_switches.STATS):
        from te_offload_shim.engine import stats_file

        stats_file.write(counts)


def _count(group: str, cleared: str, report: CacheReport, also: tuple[str, ...] = ()) -> int | None:
    """Count one clearing's report in `group` ("table" or "net"; `cleared`: its counter of clearings
    that cleared something), under `_lock`. The one first-line rule: the first clearing of the
    process, by the table or the net, is said at `first_line_level()` (seen once per job); every
    later one at DEBUG; one that cleared nothing has no line (None). `also`: the report's other
    counters of what was cleared."""
    counts = _c[group]
    counts["skipped"] += len(report.skipped)
    counts["errors"] += len(report.errors)
    if not (report.entries or any(getattr(report, key) for key in also)):
        return None
    counts[cleared] += 1
    for key in ("entries", "modules", "bytes", *also):
        counts[key] += getattr(report, key)
    first, _c["announced"] = not _c["announced"], True
    return first_line_level() if first else logging.DEBUG


def count_table(name: str, report: CacheReport) -> int | None:
    """Count one wrapped call's clearing; returns the level of its line, None for no line."""
    _counting()
    with _lock:
        table = _c["table"]
        table["calls"] += 1
        per = _c["by_target"].setdefault(name, {"calls": 0, "entries": 0, "bytes": 0})
        per["calls"] += 1
        table["primary_weight_bytes"] = report.primary_weight_bytes
        _c["caching_off"] = dict(report.caching_off)
        _c["caching_off_by_target"].pop(name, None)
        level = _count("table", "cleared_calls", report)
        if report.entries:
            table["released_bytes"] += report.released_bytes or 0
            per["entries"] += report.entries
            per["bytes"] += report.bytes
        elif report.caching_off:  # a 0 that is no clearing's doing says why, once per reason
            _c["caching_off_by_target"][name] = dict(report.caching_off)
            new = not _c["said_off"].issuperset(report.caching_off)
            _c["said_off"].update(report.caching_off)
            level = first_line_level() if new else logging.DEBUG
    if report.entries:
        _write_file()
    return level


def count_net(report: CacheReport, caller: str) -> int | None:
    """Count one clearing of the flush net; returns the level of its line, None when it cleared nothing."""
    _counting()
    with _lock:
        # FP8 primary weights have no entry: the net's clearing of their transposes counts too
        level = _count("net", "cleared_flushes", report, ("primary_weight_cleared",))
        if level is None:
            return None
        if len(_c["callers"]) < 16:
            _c["callers"].setdefault(caller, None)
    _write_file()
    return level


def set_net(key: str, value: int) -> None:
    """A figure of the net's arming (`frozen_not_searched`), not a count."""
    with _lock:
        _c["net"][key] = value


def add(group: str, key: str) -> None:
    """One more of `key` (`errors`, `flushes`) in `group` ("table" or "net")."""
    _counting()
    with _lock:
        _c[group][key] += 1


def left_alone(name: str, reason: str) -> None:
    _counting()
    with _lock:
        per = _c["left_alone"].setdefault(name, {})
        per[reason] = per.get(reason, 0) + 1


def caching_off_at_last_call(name: str) -> dict[str, int]:
    """`{reason: TE layers}` whose caching was off by configuration at target `name`'s last call,
    when that call cleared nothing; empty otherwise."""
    with _lock:
        return dict(_c["caching_off_by_target"].get(name, {}))


def net_counts() -> tuple[NetTotals, list[str]]:
    """The net's counters and the callers of its clearing flushes."""
    with _lock:
        return dict(_c["net"]), list(_c["callers"])  # type: ignore[return-value]


def counts() -> dict[str, Any]:
    """Every counter, as plain data: `stats()` less the latest audit and TE's process globals, which
    engine/stats_file.py adds."""
    with _lock:
        result: dict[str, Any] = dict(_c["table"])
        for key in ("by_target", "left_alone"):
            result[key] = {k: dict(v) for k, v in _c[key].items()}
        result["caching_off"] = dict(_c["caching_off"])
        result["net"] = dict(_c["net"])
    return result


def reset() -> None:
    from te_offload_shim.te import process_globals

    with _lock:
        frozen = _c["net"]["frozen_not_searched"]  # a figure of the net's arming, not a count
        _c.update(_zero())
        _c["net"]["frozen_not_searched"] = frozen
    process_globals.reset()
    if _switches.audit():
        from te_offload_shim.reports import audit

        audit.reset()
