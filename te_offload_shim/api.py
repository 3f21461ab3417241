"""The functions a user calls: `uninstall`, `status`, `stats`, `scan`, `clear_fp8_workspaces`,
`residue`; and `all_targets`, for `status` and the health report only (integrations/table.py's,
where the watch table's callback for the table's modules lives: a training process never loads this
module for it; it returns the engine's `Target`, which is no public type: the package does not export
it, and `status()`'s rows say the same to a user).

The package exports the functions a user calls (`te_offload_shim.status()`), and this module loads on the first
use of one: not at start-up. `install` and `installed` are in the package itself; the install state is
the import hook's (`_hook.HOOK`), read here by its public names. Each function imports what it needs
when called, so that asking for `status()` never imports torch or a framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_offload_shim._hook import HOOK

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target
    from te_offload_shim.engine.states import Stats, Status
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.report import CacheReport


def uninstall() -> int:
    """Stop watching, disarm every wrapper wherever it sits, restore every original (module
    attributes, rebound aliases, Ray's loaders and actor method copies).

    Returns how many patched attributes were restored; never raises. No patch lands after it
    returns. `install()` works again afterwards."""
    return HOOK.uninstall(_restore)


def _restore() -> int:
    from te_offload_shim._log import warn_once
    from te_offload_shim.engine import net, registry

    restored, errors = registry.deactivate()
    net.disarmed()
    for error in errors:
        warn_once(f"uninstall:{error}", "te_offload_shim: uninstall could not restore %s", error)
    return restored


def all_targets() -> tuple[Target, ...]:
    """The built-in table plus `TE_OFFLOAD_SHIM_TARGETS`, as installed (or as they would be)."""
    from te_offload_shim.integrations.table import all_targets as all_targets_

    return all_targets_()


def status() -> Status:
    """What this process has: switches, and for each target whether it is imported and patched.
    Reads only: it never patches (a target module whose callback failed is patched again only when
    its module is re-imported or reloaded)."""
    from te_offload_shim._version import __version__
    from te_offload_shim.engine.status import status as status_

    failures = dict(HOOK.errors)
    hook_errors = [f"{module}: {why}" for module, why in failures.items()]
    return status_(all_targets(), HOOK.installed, list(HOOK.problems), hook_errors, __version__, failures)


def stats() -> Stats:
    """Totals so far in this process: calls, entries, bytes (and per target); `audit`: the latest
    residue report of `TE_OFFLOAD_SHIM_AUDIT` (None until one ran)."""
    from te_offload_shim.engine import stats as counters

    return counters.counts()


def clear_fp8_workspaces(models: object, *, strict: bool | None = None) -> CacheReport:
    """Drop TE's cached FP8 weight copies in `models` now; returns what was cleared and skipped."""
    import te_offload_shim.integrations  # noqa: F401  # loading it tells the engine the frameworks' graph marks
    from te_offload_shim import _switches
    from te_offload_shim.engine import attributes
    from te_offload_shim.te.caches import clear_fp8_workspaces as clear

    strict = _switches.strict() if strict is None else strict
    return clear(models, graphs=attributes.cuda_graphs(), strict=strict)


def scan(models: object) -> CacheReport:
    """What `clear_fp8_workspaces(models)` would clear, changing nothing."""
    import te_offload_shim.integrations  # noqa: F401  # loading it tells the engine the frameworks' graph marks
    from te_offload_shim.engine import attributes
    from te_offload_shim.te.caches import scan as scan_

    return scan_(models, graphs=attributes.cuda_graphs())


def residue(models: object, *, device_type: str | None = None) -> ResidueReport:
    """What `models` still hold on a device (any but the CPU, or exactly `device_type`), by
    category, each storage once; with the process's allocator and driver numbers. Changes nothing."""
    from te_offload_shim.reports.residue import residue as residue_

    return residue_(models, device_type=device_type)
