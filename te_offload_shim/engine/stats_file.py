"""`stats()` as plain data, and the stats file (`TE_OFFLOAD_SHIM_STATS`) that carries it out of the
process for an operator to sum (`te-offload-shim stats FILES`), one file per process.

Loaded only where one of them is asked for: by `stats()` and `status()`, and by the counters
(engine/stats.py) in a process that names a stats file, after each clearing that freed something
and once at exit. The counters stay engine/stats.py's: their owner hands its snapshot (or its
reader, `counts`) to each function here, so this module never imports it (engine/stats.py imports
this one: the other way would be a cycle); it names their types from engine/counters.py.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from te_offload_shim import _switches
from te_offload_shim._locks import Lock
from te_offload_shim._log import fail_open

if TYPE_CHECKING:
    from collections.abc import Callable

    from te_offload_shim.engine.counters import Counters
    from te_offload_shim.engine.states import NetTotals, Stats

# Made exclusively and never through a link planted at its name; closed in a child a process starts.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Destination:
    """Where this process writes, resolved once, at its first write: with `{rank}` filled at the
    exit write instead, a job whose rank came from `torch.distributed` wrote a second file once
    `destroy_process_group()` had made the rank unknown. Resolved again only by a forked child (a
    process of its own) or for another template."""

    pid: int
    template: str
    path: str
    rank: str | None  # the rank known at the first write, or at a later one; None: never known


_lock = Lock()  # one writer at a time: the snapshot taken last is the one that lands last
_destination: Destination | None = None


def as_stats(c: Counters) -> Stats:
    """`stats()`: every counter of snapshot `c`, as plain data (the stats file's document, less its rank)."""
    table, targets = c.table, c.targets.items()
    return {
        "calls": table.calls,
        "cleared_calls": table.cleared_calls,
        "entries": table.entries,
        "modules": table.modules,
        "bytes": table.bytes,
        "released_bytes": table.released_bytes,
        "skipped": table.skipped,
        "errors": table.errors,
        "primary_weight_bytes": table.primary_weight_bytes,
        "primary_weight_cleared": table.primary_weight_cleared,
        "by_target": {
            name: {
                "calls": per.calls,
                "entries": per.entries,
                "bytes": per.bytes,
                "primary_weight_cleared": per.primary_weight_cleared,
            }
            for name, per in targets
            if per.calls
        },
        "left_alone": {name: per.left_alone for name, per in targets if per.left_alone},
        "caching_off": c.caching_off,
        "net": net_totals(c),
        "te_globals": asdict(c.te_globals),
        "audit": c.audit,
    }


def net_totals(c: Counters) -> NetTotals:
    """The flush net's counters of snapshot `c`, in `stats()["net"]` and its `status()` row alike."""
    net = c.net
    return {
        "flushes": net.flushes,
        "cleared_flushes": net.cleared_flushes,
        "entries": net.entries,
        "modules": net.modules,
        "bytes": net.bytes,
        "primary_weight_cleared": net.primary_weight_cleared,
        "skipped": net.skipped,
        "errors": net.errors,
        "undecided": net.undecided,
        "frozen_not_searched": c.arming.frozen_not_searched,
    }


def write_at_exit(counts: Callable[[], Stats]) -> object:
    """Write the file at exit too (registered once, by the counters: see `stats._counting`)."""
    return atexit.register(write, counts)


def write(counts: Callable[[], Stats]) -> None:
    """`TE_OFFLOAD_SHIM_STATS=<path>` (`{rank}`, `{pid}` filled in at the first write): `stats()` and
    the process's `rank` (None where it was never known) as one JSON document, written whole (a
    temporary file, then `os.replace`) so a reader never sees half of one. Never raises: a full
    disk or a missing folder is warned about once and the offload goes on."""
    template = os.environ.get(_switches.STATS, "").strip()
    if not template:
        return
    try:
        with _lock:
            where = _resolved(template)
            _replace(where.path, json.dumps({**counts(), "rank": where.rank}, default=str))
    except Exception as exc:  # never strict: the file is a report, written at exit too
        key = f"stats-file:{type(exc).__name__}"
        fail_open(exc, key, "te_offload_shim: %s: cannot write %r: %s", _switches.STATS, template, exc, strict=False)


def _resolved(template: str) -> Destination:
    global _destination
    pid, rank, where = os.getpid(), _switches.rank(), _destination
    if where is None or where.pid != pid or where.template != template:
        path = template.replace("{rank}", rank or "none").replace("{pid}", str(pid))
        where = _destination = Destination(pid, template, path, rank)
    elif where.rank is None:
        where.rank = rank  # known since: said in the file, which keeps its path
    return where


def _replace(path: str, data: str) -> None:
    """Put `data` at `path` whole: a temporary file of an unguessable name beside it, made
    exclusively (never a link planted there, never another writer's file), then renamed over
    `path`. The temporary file is removed on every failure (a full disk included)."""
    temporary = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    fd = os.open(temporary, _CREATE, 0o666)  # raises before anything of ours exists there
    try:
        with open(fd, "w", encoding="utf-8") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
