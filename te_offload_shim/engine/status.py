"""What the shim has done in this process, read-only: `status()` per target, `stats()` totals.

Reads the registry and the handler's counters; patches nothing (the import callback that patches
is `engine.patch.on_target_import`). The report types are in `engine/states.py`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from te_offload_shim import _switches
from te_offload_shim.engine import registry
from te_offload_shim.engine.attributes import owner_of
from te_offload_shim.engine.states import Stats, Status, TargetRow, TargetState, TargetTotals

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target

__all__ = ["Stats", "Status", "TargetRow", "TargetState", "TargetTotals", "stats", "status"]


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
        imported = target.module in sys.modules
        recorded = registry.state(target.name)
        state: TargetState
        detail = ""
        failure = (failures or {}).get(target.module)
        if recorded is not None:
            state, detail = recorded
        elif failure is not None and installed:
            why, attempts, retried = failure
            then = "retried at the next import" if retried else f"given up after {attempts} attempts"
            state, detail = "error", f"patching {target.module} was interrupted ({why}); {then}"
        elif _switches.is_disabled(target.name):
            state = "disabled"
        else:
            state = "pending" if installed else "not installed"
        failed = registry.failed_clearings(target.name)
        if failed is not None and state != "error":
            count, why = failed
            detail = f"clearing failed at {count} call(s), the offload going on without it; the latest: {why}"
        rows.append(
            {
                "name": target.name,
                "target": target.path,
                "imported": imported,
                "state": state,
                "detail": detail,
                "layers": _layers(target) if imported else 0,
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
    }


def _layers(target: Target) -> int:
    # Our wrappers exist only once engine/wrapper.py is loaded (by the first patch, and wrapt with
    # it); importing it here would load wrapt into a process that never patched anything.
    wrapper = sys.modules.get("te_offload_shim.engine.wrapper")
    module = sys.modules.get(target.module)
    if wrapper is None or module is None:
        return 0
    try:
        found = owner_of(module, target.attribute)
        return wrapper.shim_layers(vars(found[0])[found[1]]) if found else 0
    except Exception:
        return 0


def stats() -> Stats:
    from te_offload_shim.engine import handler
    from te_offload_shim.reports import audit

    result: Stats = handler.totals()  # type: ignore[assignment]  # the counters, by name
    result["audit"] = audit.latest()
    return result
