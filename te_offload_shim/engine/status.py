"""What the shim has done in this process, as typed reports: `status()` per target, `stats()` totals.

Also the callback that patches a target module when it is imported (the start-up path hands it the
module, and this is where a target that cannot be patched is said to the operator).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    from types import ModuleType

    from te_offload_shim.integrations.targets import Target

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
    imported: bool
    state: TargetState
    detail: str  # why, for "error" (else empty)
    layers: int  # our wrapper layers on the attribute (1 when patched)


class Status(TypedDict):
    version: str
    enabled: bool
    installed: bool
    strict: bool
    targets: list[TargetRow]
    user_target_problems: list[str]
    hook_errors: list[str]


class TargetTotals(TypedDict):
    calls: int
    entries: int
    bytes: int


class Stats(TypedDict):
    calls: int  # wrapped offload calls
    cleared_calls: int  # of those, calls that cleared at least one entry
    entries: int  # cache entries cleared
    modules: int  # TE modules whose caches were cleared
    bytes: int  # bytes those entries held (each storage once)
    released_bytes: int  # allocator bytes released by the clearing (CUDA only; 0 elsewhere)
    skipped: int  # modules or chunks left alone (CUDA graphs, TE < 1.8 layout, ...)
    errors: int  # the shim's own errors (each also logged once)
    primary_weight_bytes: int  # FP8 primary weights' transpose/columnwise copies seen at the last call
    by_target: dict[str, TargetTotals]
    left_alone: dict[str, dict[str, int]]  # target -> the reason its skip rule gave -> calls left alone
    audit: dict[str, Any] | None  # the latest TE_OFFLOAD_SHIM_AUDIT report (None until one ran)


def on_target_import(module: ModuleType, targets: tuple[Target, ...]) -> None:
    """Patch every target that lives in `module`; say once of each one that cannot be patched."""
    from te_offload_shim import _log
    from te_offload_shim.engine import patch

    spec = getattr(module, "__spec__", None)
    name = spec.name if spec is not None else module.__name__
    for target in targets:
        if target.module != name:
            continue
        state, detail = patch.apply(target, module)
        if state == "error" or (state == "absent" and target.user):
            # A target that cannot be patched says so where the operator looks: the log, and status.
            _log.warn_once(
                f"unpatchable:{target.name}",
                "te_offload_shim: %s is not patched (%s); its offload runs without clearing FP8 caches",
                target.path,
                f"error: {detail}" if state == "error" else f"{name} has no attribute {target.attribute}",
            )


def status(targets: tuple[Target, ...], installed: bool, problems: list[str], hook_errors: list[str]) -> Status:
    from te_offload_shim import __version__, _switches

    registry = sys.modules.get("te_offload_shim.engine.registry")  # loaded with the first patch
    rows: list[TargetRow] = []
    for target in targets:
        imported = target.module in sys.modules
        recorded = registry.state(target.name) if registry is not None else None
        state: TargetState
        detail = ""
        if recorded is not None:
            state, detail = recorded
        elif _switches.is_disabled(target.name):
            state = "disabled"
        else:
            state = "pending" if installed else "not installed"
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
        "version": __version__,
        "enabled": _switches.enabled(),
        "installed": installed,
        "strict": _switches.strict(),
        "targets": rows,
        "user_target_problems": problems,
        "hook_errors": hook_errors,
    }


def _layers(target: Target) -> int:
    patch = sys.modules.get("te_offload_shim.engine.patch")  # loaded with the first patch; wrapt with it
    module = sys.modules.get(target.module)
    if patch is None or module is None:
        return 0
    try:
        found = patch.owner_of(module, target.attribute)
        return patch.shim_layers(vars(found[0])[found[1]]) if found else 0
    except Exception:
        return 0


def stats() -> Stats:
    from te_offload_shim.engine import handler

    audit = sys.modules.get("te_offload_shim.reports.audit")
    result: Stats = handler.totals()  # type: ignore[assignment]  # the counters, by name
    result["audit"] = audit.latest() if audit is not None else None
    return result
