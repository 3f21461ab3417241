"""The typed reports of the engine: each target's `TargetState`, the `status()` rows and report,
and the `stats()` totals. Types only, importing nothing of the package: the start-up module names
them for type checkers, and `engine/status.py` and `engine/stats_file.py` fill them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

TargetState = Literal[
    "patched",  # our wrapper is in place and armed
    "pending",  # installed, the target module is not imported yet
    "not installed",  # the shim is not installed in this process
    "disabled",  # switched off by TE_OFFLOAD_SHIM_DISABLE
    "fixed upstream",  # this release clears the caches itself: left alone
    "absent",  # the module has no such attribute (another release of the framework)
    "error",  # patching failed: `detail` says why; the target runs unpatched
]


class TargetRow(TypedDict):
    name: str
    target: str  # module:attribute
    imported: bool  # in sys.modules and run (a lazily loaded module that has not run yet: False)
    state: TargetState
    detail: str  # why, for "error"; for another state, the clearings that failed, if any (else empty)
    layers: int  # our wrapper layers on the attribute (1 when patched)
    # bytes of FP8 primary weights' transposes its clearings dropped in this process (they have no entry)
    primary_weight_cleared: int


class _NetCounts(TypedDict):
    """The flush net's counters (engine/net.py), in its `status()` row and in `stats()["net"]` alike."""

    flushes: int  # allocator flushes the net saw (while on)
    cleared_flushes: int  # of those, flushes before which it cleared at least one cache entry
    entries: int  # cache entries it cleared
    bytes: int  # bytes those entries held (each storage once)
    primary_weight_cleared: int  # bytes of FP8 primary weights' transposes it dropped (they have no entries)
    # TE layers it could not decide at a flush (summed over flushes): an own weight empty on the device
    # and none other on it, which a reshard and an offload that marked nothing both leave; left alone
    undecided: int
    frozen_not_searched: int  # objects frozen by gc.freeze() when it armed: not searched for layers


class NetRow(_NetCounts):
    """The flush net's row (engine/net.py): armed or not and why, and what it has cleared."""

    state: str  # "armed", "off" (a switch), "not armed" (TE not imported, or uninstalled), "error"
    detail: str  # why, in one line
    layers: int  # TE layers whose caches it cleared (summed over flushes)
    live_layers: int  # TE layers it knows of now (weak references)
    found_at_arming: int  # layers built before the net armed, found then
    callers: list[str]  # "file:line in function" of the flushes that cleared something (distinct, first 16)
    undecided_layers: list[str]  # "Class.parameter" of the layers it could not decide (distinct, first 16)


class Status(TypedDict):
    version: str
    enabled: bool
    installed: bool
    strict: bool
    targets: list[TargetRow]
    user_target_problems: list[str]
    hook_errors: list[str]
    net: NetRow


class NetTotals(_NetCounts):
    modules: int  # TE layers whose caches it cleared (summed over flushes)
    skipped: int  # layers left alone at its clearings (CUDA graphs, TE < 1.8, ...)
    errors: int  # its own errors (each kind also logged once)


class TargetTotals(TypedDict):
    calls: int
    entries: int
    bytes: int
    primary_weight_cleared: int  # bytes of FP8 primary weights' transposes the clearings dropped (no entries)


class Stats(TargetTotals):
    """The totals of the table's targets (`calls`: wrapped offload calls; `entries`: cache entries
    cleared; `bytes`: bytes those entries held, each storage once), and the net's own."""

    cleared_calls: int  # of those calls, calls that freed something (an entry, or a primary weight's transpose)
    modules: int  # TE modules whose caches were cleared
    released_bytes: int  # allocator bytes released by the clearing (CUDA only; 0 elsewhere)
    skipped: int  # modules or chunks left alone (CUDA graphs, TE < 1.8 layout, ...)
    errors: int  # the shim's own errors (each also logged once)
    primary_weight_bytes: int  # FP8 primary weights' transpose/columnwise copies left in place at the last call
    # TE layers that held nothing at the last call because caching is off by configuration (Megatron's
    # disable_parameter_transpose_cache, TE under FSDP2), by reason: its 0 entries cleared are no loss
    caching_off: dict[str, int]
    by_target: dict[str, TargetTotals]
    left_alone: dict[str, dict[str, int]]  # target -> the reason its skip rule gave -> calls left alone
    audit: dict[str, Any] | None  # the latest TE_OFFLOAD_SHIM_AUDIT report (None until one ran)
    # TE_OFFLOAD_SHIM_TE_GLOBALS: TE globals given back (calls, entries, bytes) and kept ({reason: calls})
    te_globals: dict[str, Any]
    net: NetTotals  # the flush net's own counters (the totals above are the table's)
