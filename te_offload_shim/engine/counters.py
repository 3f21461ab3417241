"""The counters' types: what `engine/stats.py`, their one owner, keeps, and what the readers of a
snapshot (`engine/status.py`, `engine/stats_file.py`) are handed. Types only, importing nothing of
the package, so that a reader can name them without importing their owner.
"""

from dataclasses import dataclass, field
from typing import Any


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
