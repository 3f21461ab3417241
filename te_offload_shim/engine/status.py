"""What the shim has done in this process, read-only: `status()` per target, `stats()` totals.

Reads the registry and the handler's counters; patches nothing (the import callback that patches
is `engine.patch.patch_targets_in`). The report types are in `engine/states.py`.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from te_offload_shim import _switches
from te_offload_shim.engine import registry
from te_offload_shim.engine.attributes import owner_of
from te_offload_shim.engine.states import NetRow, NetTotals, Stats, Status, TargetRow, TargetState, TargetTotals

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target

__all__ = ["NetRow", "NetTotals", "Stats", "Status", "TargetRow", "TargetState", "TargetTotals", "stats", "status"]


def status(
    targets: tuple[Target, ...],
    installed: bool,
    problems: list[str],
    hook_errors: list[str],
    version: str,
    failures: dict[str, tuple[str, int, bool]] | None = None,
) -> Status:
    """`failures`: module -> (why its post-import callback raised, attempts, whether it runs again),
    for those whose callback has not succeeded since."""
    rows: list[TargetRow] = []
    for target in targets:
        loaded = _loaded(target.module)
        layers, armed = _layers(target, loaded) if loaded is not None else (0, 0)
        state, detail = _state(target, installed, (failures or {}).get(target.module), armed, loaded is not None)
        failed = registry.failed_clearings(target.name)
        if failed is not None and state != "error":
            count, why = failed
            detail = f"clearing failed at {count} call(s), the offload going on without it; the latest: {why}"
        elif state == "patched" and not detail:
            detail = _caching_off_detail(target.name)
        rows.append(
            {
                "name": target.name,
                "target": target.path,
                "imported": loaded is not None,
                "state": state,
                "detail": detail,
                "layers": layers,
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
        "net": net_row(installed),
    }


def net_row(installed: bool) -> NetRow:
    """The flush net's row. engine/net.py is loaded when the net arms (TE's base module imported):
    until then the row says why it is not armed, and nothing is imported to say so."""
    net = sys.modules.get("te_offload_shim.engine.net")
    if net is not None:
        return net.row()
    if not installed:
        state, detail = "not armed", "the shim is not installed"
    elif not _switches.net():
        state, detail = "off", f"{_switches.NET}=0"
    else:
        state, detail = "not armed", "Transformer Engine's PyTorch modules are not imported: torch's flush is its own"
    return {
        "state": state,
        "detail": detail,
        "flushes": 0,
        "cleared_flushes": 0,
        "layers": 0,
        "entries": 0,
        "bytes": 0,
        "live_layers": 0,
        "found_at_arming": 0,
        "frozen_not_searched": 0,
        "primary_weight_cleared": 0,
        "callers": [],
    }


def _caching_off_detail(name: str) -> str:
    # The handler is loaded by the first wrapped call: not loaded, no call yet (and status() loads
    # nothing it does not need).
    handler = sys.modules.get("te_offload_shim.engine.handler")
    off = handler.caching_off_at_last_call(name) if handler is not None else {}
    if not off:
        return ""
    from te_offload_shim.te.caching_off import describe

    return f"nothing to clear at its last call: FP8 weight caching is off by configuration in {describe(off)}"


def _state(
    target: Target, installed: bool, failure: tuple[str, int, bool] | None, armed: int, imported: bool
) -> tuple[TargetState, str]:
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
        why, attempts, retried = failure
        then = "retried at the next import" if retried else f"given up after {attempts} attempts"
        return "error", f"patching {target.module} was interrupted ({why}); {then}"
    if _switches.is_disabled(target.name):
        return "disabled", ""
    return ("pending" if installed else "not installed"), ""


def _loaded(name: str) -> Any:
    """What `name` is in sys.modules if it has run, else None: a module loaded with LazyLoader has
    not, until its first attribute read (reading its namespace here would run it). Anything else
    there counts (a module may put another object in its place)."""
    module = sys.modules.get(name)
    if module is None or (issubclass(type(module), ModuleType) and registry.namespace(module) is None):
        return None
    return module


def _layers(target: Target, module: Any) -> tuple[int, int]:
    """(our wrappers on the attribute, those of them still armed)."""
    # Our wrappers exist only once engine/wrapper.py is loaded (by the first patch, and wrapt with
    # it); importing it here would load wrapt into a process that never patched anything.
    wrapper = sys.modules.get("te_offload_shim.engine.wrapper")
    if wrapper is None:
        return 0, 0
    try:
        found = owner_of(module, target.attribute)
        if not found:
            return 0, 0
        raw = vars(found[0])[found[1]]
        return wrapper.shim_layers(raw), wrapper.armed_layers(raw)
    except Exception:
        return 0, 0


def stats() -> Stats:
    from te_offload_shim.engine import handler
    from te_offload_shim.reports import audit

    result: Stats = handler.totals()  # type: ignore[assignment]  # the counters, by name
    result["audit"] = audit.latest()
    net = sys.modules.get("te_offload_shim.engine.net")
    zero: NetTotals = dict.fromkeys(NetTotals.__annotations__, 0)  # type: ignore[assignment]
    result["net"] = net.totals() if net is not None else zero
    return result
