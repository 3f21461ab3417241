"""te_offload_shim: drop Transformer Engine's cached FP8 weight copies when a Megatron model is
offloaded, in verl < 0.9, Megatron's own offload and the other Megatron RL frameworks.

`import te_offload_shim` installs the shim: it watches for the target modules and wraps their
offload functions when they are imported. Until then nothing beyond the standard library is
imported. `TE_OFFLOAD_SHIM=0` turns the package into a no-op.
"""

import sys

from te_offload_shim import _switches, _watch
from te_offload_shim._locks import Lock
from te_offload_shim.integrations.targets import BUILTIN, Target, parse_user_targets

TYPE_CHECKING = False  # typing costs milliseconds at every interpreter start

if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.caches import CacheReport

__version__ = "0.2.0"
__all__ = [
    "clear_fp8_workspaces",
    "install",
    "installed",
    "ray_setup",
    "residue",
    "scan",
    "stats",
    "status",
    "uninstall",
]

_lock = Lock(reentrant=True)
_installed = False
_targets: "tuple[Target, ...]" = ()
_problems: "list[str]" = []
_hook_errors: "list[str]" = []


def _warn(key: "str", message: "str", *args: "object") -> "None":
    from te_offload_shim._log import warn_once

    warn_once(key, message, *args)


def _on_hook_error(module: "str", exc: "BaseException") -> "None":
    _hook_errors.append(f"{module}: {type(exc).__name__}: {exc}")
    _warn(f"hook:{module}", "te_offload_shim: patching %s failed (%s); it runs unpatched", module, repr(exc))


def _on_import(module: "ModuleType") -> "None":
    from te_offload_shim.engine import patch

    spec = getattr(module, "__spec__", None)
    name = spec.name if spec is not None else module.__name__
    for target in _targets:
        if target.module != name:
            continue
        state = patch.apply(target, module)
        if state.startswith("error") or (state == "absent" and target.user):
            # A target that cannot be patched says so where the operator looks: the log, and status.
            _warn(
                f"unpatchable:{target.name}",
                "te_offload_shim: %s is not patched (%s); its offload runs without clearing FP8 caches",
                target.path,
                state if state != "absent" else f"{name} has no attribute {target.attribute}",
            )


def _on_ray_import(module: "ModuleType") -> "None":
    # ray.init gains our worker_process_setup_hook, so the job's workers on every node are covered.
    from te_offload_shim.integrations import ray

    ray.on_ray_import(module)


def _on_ray_function_manager(module: "ModuleType") -> "None":
    # A Ray actor runs by-value copies of its methods: patch them as each actor class is loaded.
    from te_offload_shim.integrations import ray

    ray.on_function_manager_import(module)


def all_targets() -> "tuple[Target, ...]":
    """The built-in table plus `TE_OFFLOAD_SHIM_TARGETS`, as installed (or as they would be)."""
    if _installed:
        return _targets
    user, _ = parse_user_targets(_switches.user_targets())
    return (*BUILTIN, *user)


def _check_switches(targets: "tuple[Target, ...]") -> "None":
    for problem in _switches.switch_problems(tuple(t.name for t in targets)):
        _warn(f"switch:{problem}", "te_offload_shim: %s", problem)


def install() -> "bool":
    """Watch every target module and patch it on import (at once if already imported).

    Idempotent and thread-safe; never waits for another thread's import. Returns False when
    `TE_OFFLOAD_SHIM=0`."""
    global _installed, _targets
    if not _switches.enabled():
        return False
    with _lock:
        if _installed:
            return True
        user, problems = parse_user_targets(_switches.user_targets())
        _problems[:] = problems
        for problem in problems:
            _warn(f"user-target:{problem}", "te_offload_shim: ignoring %s entry %s", _switches.TARGETS, problem)
        _targets = (*BUILTIN, *user)
        _check_switches(_targets)
        _installed = True  # what _registry.active() reads: patches may land from here on
        _watch.set_error_handler(_on_hook_error)
        for module in dict.fromkeys(t.module for t in _targets):
            _watch.watch(module, _on_import)
        _watch.watch("ray", _on_ray_import)
        _watch.watch("ray._private.function_manager", _on_ray_function_manager)
    return True


def uninstall() -> "int":
    """Stop watching, disarm every wrapper wherever it sits, restore every original (module
    attributes, rebound aliases, Ray's loaders and actor method copies).

    Returns how many patched attributes were restored; never raises. No patch lands after it
    returns. `install()` works again afterwards."""
    global _installed
    with _lock:
        _installed = False
        try:
            _watch.unwatch_all()
        except Exception as exc:
            _warn("uninstall:watch", "te_offload_shim: uninstall could not remove the import watcher: %r", exc)
        registry = sys.modules.get("te_offload_shim.engine.registry")
        deactivate = getattr(registry, "deactivate", None)
        if deactivate is None:
            return 0  # no patch was ever made (or the first one is still importing: it will see the flag)
        restored, errors = deactivate()
        for error in errors:
            _warn(f"uninstall:{error}", "te_offload_shim: uninstall could not restore %s", error)
        return restored


def installed() -> "bool":
    return _installed


def status() -> "dict[str, Any]":
    """What this process has: switches, and for each target whether it is imported and patched."""
    if _installed:
        _watch.catch_up()
    registry = sys.modules.get("te_offload_shim.engine.registry")
    rows = []
    for target in all_targets():
        imported = target.module in sys.modules
        state = registry.state(target.name) if registry is not None else None
        if state is None:
            if _switches.is_disabled(target.name):
                state = "disabled"
            else:
                state = "pending" if _installed else "not installed"
        rows.append(
            {
                "name": target.name,
                "target": target.path,
                "imported": imported,
                "state": state,
                "layers": _layers(target) if imported else 0,
            }
        )
    return {
        "version": __version__,
        "enabled": _switches.enabled(),
        "installed": _installed,
        "strict": _switches.strict(),
        "targets": rows,
        "user_target_problems": list(_problems),
        "hook_errors": list(_hook_errors),
    }


def _layers(target: "Target") -> "int":
    patch = sys.modules.get("te_offload_shim.engine.patch")  # loaded with the first patch; wrapt with it
    module = sys.modules.get(target.module)
    if patch is None or module is None:
        return 0
    try:
        found = patch.owner_of(module, target.attribute)
        return patch.shim_layers(vars(found[0])[found[1]]) if found else 0
    except Exception:
        return 0


def stats() -> "dict[str, Any]":
    """Totals so far in this process: calls, entries, bytes (and per target); `audit`: the latest
    residue report of `TE_OFFLOAD_SHIM_AUDIT` (None until one ran)."""
    from te_offload_shim.engine import handler

    result = handler.stats()
    audit = sys.modules.get("te_offload_shim.reports.audit")
    result["audit"] = audit.latest() if audit is not None else None
    return result


def clear_fp8_workspaces(models: "object", *, strict: "bool | None" = None) -> "CacheReport":
    """Drop TE's cached FP8 weight copies in `models` now; returns what was cleared and skipped."""
    from te_offload_shim.te.caches import clear_fp8_workspaces as clear

    return clear(models, strict=strict)


def scan(models: "object") -> "CacheReport":
    """What `clear_fp8_workspaces(models)` would clear, changing nothing."""
    from te_offload_shim.te.caches import scan as scan_

    return scan_(models)


def residue(models: "object", *, device_type: "str | None" = None) -> "ResidueReport":
    """What `models` still hold on a device (any but the CPU, or exactly `device_type`), by
    category, each storage once; with the process's allocator and driver numbers. Changes nothing."""
    from te_offload_shim.reports.residue import residue as residue_

    return residue_(models, device_type=device_type)


def ray_setup() -> "None":
    """For `runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"}`. Never raises:
    a raising setup hook kills the Ray worker."""
    try:
        install()
    except Exception as exc:  # pragma: no cover - install() itself fails open
        try:
            _warn("ray-setup", "te_offload_shim: ray_setup failed: %r", exc)
        except Exception:  # not even logging may fail the worker
            pass


if _switches.enabled():
    install()
