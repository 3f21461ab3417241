"""The functions a user calls: `uninstall`, `status`, `stats`, `scan`, `clear_fp8_workspaces`,
`residue`, `ray_setup` (and `all_targets`).

The package exports each of them (`te_offload_shim.status()`), and this module loads on the first
use of one: not at start-up. `install` and `installed` are in the package itself, which runs
`install()` when imported. Each function imports what it needs when called, so that asking for
`status()` never imports torch or a framework.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import te_offload_shim as _shim

if TYPE_CHECKING:
    from te_offload_shim.engine.status import Stats, Status
    from te_offload_shim.integrations.targets import Target
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.caches import CacheReport


def uninstall() -> int:
    """Stop watching, disarm every wrapper wherever it sits, restore every original (module
    attributes, rebound aliases, Ray's loaders and actor method copies).

    Returns how many patched attributes were restored; never raises. No patch lands after it
    returns. `install()` works again afterwards."""
    from te_offload_shim._log import warn_once

    with _shim._lock:
        # The flag lives in the package: install() and engine.registry.active() read it there.
        _shim._installed = False
        try:
            _shim._load_firing().unwatch_all()
        except Exception as exc:
            warn_once("uninstall:watch", "te_offload_shim: uninstall could not remove the import watcher: %r", exc)
        registry = sys.modules.get("te_offload_shim.engine.registry")
        deactivate = getattr(registry, "deactivate", None)
        if deactivate is None:
            return 0  # no patch was ever made (or the first one is still importing: it will see the flag)
        restored, errors = deactivate()
        for error in errors:
            warn_once(f"uninstall:{error}", "te_offload_shim: uninstall could not restore %s", error)
        return restored


def all_targets() -> tuple[Target, ...]:
    """The built-in table plus `TE_OFFLOAD_SHIM_TARGETS`, as installed (or as they would be)."""
    from te_offload_shim.engine.schema import parse_user_targets
    from te_offload_shim.integrations.targets import BUILTIN

    if _shim._installed:
        return (*BUILTIN, *_shim._user_targets)
    from te_offload_shim import _switches

    return (*BUILTIN, *parse_user_targets(_switches.user_targets())[0])


def status() -> Status:
    """What this process has: switches, and for each target whether it is imported and patched."""
    if _shim._installed:
        _shim._load_firing().sweep()
    from te_offload_shim.engine.status import status as status_

    return status_(all_targets(), _shim._installed, list(_shim._problems), list(_shim._hook_errors))


def stats() -> Stats:
    """Totals so far in this process: calls, entries, bytes (and per target); `audit`: the latest
    residue report of `TE_OFFLOAD_SHIM_AUDIT` (None until one ran)."""
    from te_offload_shim.engine.status import stats as stats_

    return stats_()


def clear_fp8_workspaces(models: object, *, strict: bool | None = None) -> CacheReport:
    """Drop TE's cached FP8 weight copies in `models` now; returns what was cleared and skipped."""
    from te_offload_shim.te.caches import clear_fp8_workspaces as clear

    return clear(models, strict=strict)


def scan(models: object) -> CacheReport:
    """What `clear_fp8_workspaces(models)` would clear, changing nothing."""
    from te_offload_shim.te.caches import scan as scan_

    return scan_(models)


def residue(models: object, *, device_type: str | None = None) -> ResidueReport:
    """What `models` still hold on a device (any but the CPU, or exactly `device_type`), by
    category, each storage once; with the process's allocator and driver numbers. Changes nothing."""
    from te_offload_shim.reports.residue import residue as residue_

    return residue_(models, device_type=device_type)


def ray_setup() -> None:
    """For `runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"}`. Never raises:
    a raising setup hook kills the Ray worker."""
    try:
        _shim.install()
    except Exception as exc:  # pragma: no cover - install() itself fails open
        try:
            from te_offload_shim._log import warn_once

            warn_once("ray-setup", "te_offload_shim: ray_setup failed: %r", exc)
        except Exception:  # not even logging may fail the worker
            pass
