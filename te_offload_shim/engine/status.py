"""What the shim has done in this process, read-only: `status()` per target (`stats()` totals are
engine/stats_file.py's).

Reads the registry, the net's arming and a snapshot of the counters (engine/stats.py); patches nothing and
imports nothing that does (the import callback that patches is `engine.patch.patch_targets_in`).
The report types are in `engine/states.py`.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim._hook import namespace
from te_offload_shim.engine import registry
from te_offload_shim.engine import stats as counters
from te_offload_shim.engine.attributes import owner_of
from te_offload_shim.engine.states import NetRow, NetTotals, Stats, Status, TargetRow, TargetState, TargetTotals

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target

__all__ = ["NetRow", "NetTotals", "Stats", "Status", "TargetRow", "TargetState", "TargetTotals", "status"]


def status(
    targets: tuple[Target, ...],
    installed: bool,
    problems: list[str],
    hook_errors: list[str],
    version: str,
    failures: dict[str, str] | None = None,
) -> Status:
    """`failures`: module -> why its patch callback raised (the import hook runs it again only when
    the module is imported again or reloaded)."""
    counted = counters.snapshot()
    rows: list[TargetRow] = []
    for target in targets:
        loaded = _loaded(target.module)
        layers, armed = _layers(target, loaded) if loaded is not None else (0, 0)
        state, detail = _state(target, installed, (failures or {}).get(target.module), armed, loaded is not None)
        per = counted.targets.get(target.name) or counters.PerTarget()
        if per.failed and state != "error":
            why = f"the offload going on without it; the latest: {per.failed_why}"
            detail = f"clearing failed at {per.failed} call(s), {why}"
        elif state == "patched" and not detail and per.caching_off:
            detail = _caching_off_detail(per.caching_off)
        rows.append(
            {
                "name": target.name,
                "target": target.path,
                "imported": loaded is not None,
                "state": state,
                "detail": detail,
                "layers": layers,
                "primary_weight_cleared": per.primary_weight_cleared,
            }
        )
    return {
        "version": version,
        "enabled": _switches.enabled(),
        "installed": installed,
        "strict": _switches.strict(),
        "targets": rows,
        "user_target_problems": problems,
        "hook_errors": hook_errors,
        "net": net_row(installed, counted),
    }


def net_row(installed: bool, counted: counters.Counters) -> NetRow:
    """The flush net's row: armed or not and why (engine/net.py arms it when TE's base module is
    imported), and what it cleared (engine/stats.py)."""
    from te_offload_shim.engine import net, stats_file
    from te_offload_shim.te import layers

    arming = net.arming()
    state, detail = arming["state"], arming["detail"]
    if state == "armed":
        if not _switches.enabled():
            state, detail = "off", f"{_switches.ENABLE}=0: every flush is left alone"
        elif not _switches.net():
            state, detail = "off", f"{_switches.NET}=0: every flush is left alone"
        elif not any(r.armed and r.in_place() for r in registry.records(net.FLUSH_KIND)):
            state, detail = "error", "no flush function holds the net's wrapper any more (replaced after it armed)"
    elif state == "not armed" and not installed:
        detail = detail or "the shim is not installed"
    elif state == "not armed" and not detail:
        state, detail = ("off", f"{_switches.NET}=0") if not _switches.net() else (state, _NOT_IMPORTED)
    counts = stats_file.net_totals(counted)
    return {
        "state": state,
        "detail": detail,
        "flushes": counts["flushes"],
        "cleared_flushes": counts["cleared_flushes"],
        "layers": counts["modules"],
        "entries": counts["entries"],
        "bytes": counts["bytes"],
        "primary_weight_cleared": counts["primary_weight_cleared"],
        "undecided": counts["undecided"],
        "live_layers": layers.count(),
        "found_at_arming": counted.arming.found,
        "frozen_not_searched": counts["frozen_not_searched"],
        "callers": list(counted.net.callers),
        "undecided_layers": list(counted.net.undecided_names),
    }


_NOT_IMPORTED = "Transformer Engine's PyTorch modules are not imported: torch's flush is its own"


def _caching_off_detail(off: dict[str, int]) -> str:
    from te_offload_shim.te.caching_off import describe

    return f"nothing to clear at its last call: FP8 weight caching is off by configuration in {describe(off)}"


def _state(target: Target, installed: bool, failure: str | None, armed: int, imported: bool) -> tuple[TargetState, str]:
    """What the row says, checked against the attribute itself: never `patched` while it holds no
    armed wrapper of ours, never `patched` while a run-time switch leaves every call alone."""
    recorded = registry.state(target.name)
    if recorded is not None:
        state, detail = recorded
        if state == "patched" and imported and not armed:
            return "error", (
                f"{target.attribute} holds no wrapper of ours any more (replaced after it was patched: an "
                "assignment, or a reload the import hook did not see); its offload runs without clearing"
            )
        if state == "patched" and _switches.is_disabled(target.name):
            return "disabled", "switched off at run time (TE_OFFLOAD_SHIM_DISABLE): the wrapper leaves each call alone"
        return state, detail
    if failure is not None and installed:
        return "error", f"patching {target.module} failed ({failure}); patched again when it is re-imported or reloaded"
    if _switches.is_disabled(target.name):
        return "disabled", ""
    return ("pending" if installed else "not installed"), ""


def _loaded(name: str) -> Any:
    """What `name` is in sys.modules if it has run, else None: a module loaded with LazyLoader has
    not, until its first attribute read (reading its namespace here would run it). Anything else
    there counts (a module may put another object in its place)."""
    module = sys.modules.get(name)
    if module is None or (issubclass(type(module), ModuleType) and namespace(module) is None):
        return None
    return module


def _layers(target: Target, module: Any) -> tuple[int, int]:
    """(our wrappers on the attribute, those of them still armed)."""
    # Our wrappers exist only where a target was patched (engine/wrapper.py, and wrapt with it, are
    # loaded then): without a record, nothing is imported to say 0.
    if not any(r.target == target.name for r in registry.records()):
        return 0, 0
    try:
        from te_offload_shim.engine import wrapper

        found = owner_of(module, target.attribute)
        if not found:
            return 0, 0
        raw = vars(found[0])[found[1]]
        return wrapper.shim_layers(raw), wrapper.armed_layers(raw)
    except Exception:
        return 0, 0
