"""`stats()` as a whole, and the stats file (`TE_OFFLOAD_SHIM_STATS`) that carries it out of the
process for an operator to sum (`te-offload-shim stats FILES`).

Loaded only when one of them is asked for: by `stats()` (api.py), and by the counters
(engine/stats.py) in a process that names a stats file, after each clearing that cleared something
and once at exit. A process with no stats file that never calls `stats()` never loads it.

The counters stay engine/stats.py's: their owner hands its reader (`counts`) to each function here,
so this module never imports it (engine/stats.py imports this one: the other way would be a cycle).
"""

from __future__ import annotations

import _thread
import atexit
import json
import os
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._log import fail_open
from te_offload_shim._reload import kept

if TYPE_CHECKING:
    from collections.abc import Callable

    from te_offload_shim.engine.states import Stats

# Kept by a reload of this module (`kept`), like every lock of the package.
_write_lock = kept(globals(), "_write_lock", Lock)


def snapshot(counts: Callable[[], dict[str, Any]]) -> Stats:
    """`stats()`: every counter (`counts`: engine/stats.py's), the latest audit, and what TE's process
    globals gave back."""
    from te_offload_shim.te import process_globals

    result = counts()
    result["te_globals"] = process_globals.totals()
    result["audit"] = None
    if _switches.audit():  # the audit's module is loaded only where the audit is asked for
        from te_offload_shim.reports import audit

        result["audit"] = audit.latest()
    return result  # type: ignore[return-value]


def write_at_exit(counts: Callable[[], dict[str, Any]]) -> object:
    """Write the file at exit too (registered once, by the counters: see `stats._counting`)."""
    return atexit.register(write, counts)


def write(counts: Callable[[], dict[str, Any]]) -> None:
    """`TE_OFFLOAD_SHIM_STATS=<path>` (`{rank}`, `{pid}` filled in): `stats()` as one JSON document,
    written whole (a temporary file, then `os.replace`) so a reader never sees half of one. Never
    raises: a full disk or a missing folder is warned about once and the offload goes on."""
    template = os.environ.get(_switches.STATS, "").strip()
    if not template:
        return
    try:
        path = template.replace("{rank}", _switches.rank() or "none").replace("{pid}", str(os.getpid()))
        # One writer at a time, each with a temporary file of its own: two threads' clearings (a
        # wrapped offload, a flush) never replace each other's half-written file, and the snapshot
        # taken last is the one that lands last.
        with _write_lock:
            data = json.dumps(snapshot(counts), default=str)
            temporary = f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(data)
            os.replace(temporary, path)
    except Exception as exc:  # never strict: the file is a report, written at exit too
        key = f"stats-file:{type(exc).__name__}"
        fail_open(exc, key, "te_offload_shim: %s: cannot write %r: %s", _switches.STATS, template, exc, strict=False)
