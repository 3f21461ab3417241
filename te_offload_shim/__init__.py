"""te_offload_shim: drop Transformer Engine's cached FP8 weight copies when a Megatron model is
offloaded, in verl < 0.9, Megatron's own offload and the other Megatron RL frameworks.

`import te_offload_shim` installs the shim: it watches for the target modules and wraps their
offload functions when they are imported. `TE_OFFLOAD_SHIM=0` turns the package into a no-op.

This module and `_watch` are the start-up path: all that `import te_offload_shim` loads, standard
library only (`_switches` joins them when a `TE_OFFLOAD_SHIM*` variable is set). Everything else
(the table, the engine, TE's layouts, wrapt) is imported when a target module is, or when asked for.
"""

import _thread
import os
import sys

from te_offload_shim import _watch

TYPE_CHECKING = False  # the typing module costs milliseconds at every interpreter start

if TYPE_CHECKING:
    from types import ModuleType

    from te_offload_shim.engine.status import Stats, Status, TargetRow, TargetState
    from te_offload_shim.integrations.targets import Target
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.caches import CacheReport, ShimError, Skipped

__version__ = "0.3.0"
__all__ = [
    "CacheReport",
    "ResidueReport",
    "ShimError",
    "Skipped",
    "Stats",
    "Status",
    "TargetRow",
    "TargetState",
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

# The modules the entries of the built-in table (integrations/targets.py) live in. Written out so
# that start-up does not load the table; tests/test_layout.py fails when the two disagree.
BUILTIN_MODULES = (
    "verl.utils.megatron_utils",
    "megatron.core.distributed.param_and_grad_buffer",
    "nemo_rl.models.policy.workers.megatron_policy_worker",
    "nemo_rl.models.policy.megatron_policy_worker",
    "roll.distributed.strategy.megatron_strategy",
    "areal.engine.awex.colocate_writer",
    "areal.experimental.weight_update.awex.megatron_adapter",
    "areal.engine.megatron_engine",
    "slime.backends.megatron_utils.actor",
    "miles.backends.megatron_utils.actor",
    "swift.megatron.trainers.utils",
    "skyrl.backends.skyrl_train.distributed.megatron.megatron_utils",
    "skyrl_train.distributed.megatron.megatron_utils",
    "rlinf.hybrid_engines.megatron.megatron_model_manager",
    "chatlearn.models.megatron.memory_manager.trainer",
    "chatlearn.models.megatron.memory_manager.inference",
    "relax.backends.megatron.actor",
    "relax.backends.megatron.weight_update.train_offload",
)
_RAY = "ray"  # ray.init gains our worker setup hook (integrations/ray.py)
_RAY_ACTORS = "ray._private.function_manager"  # Ray's actor-class loaders (integrations/ray.py)

_lock = _thread.RLock()  # reset in a forked child, below: install() must work there too
_installed = False
_user_targets: "tuple[Target, ...]" = ()
_problems: list[str] = []
_hook_errors: list[str] = []


def _warn(key: str, message: str, *args: object) -> None:
    from te_offload_shim._log import warn_once

    warn_once(key, message, *args)


def _on_hook_error(module: str, exc: BaseException) -> None:
    _hook_errors.append(f"{module}: {type(exc).__name__}: {exc}")
    _warn(f"hook:{module}", "te_offload_shim: patching %s failed (%s); it runs unpatched", module, repr(exc))


def _on_import(module: "ModuleType") -> None:
    from te_offload_shim.engine.status import on_target_import

    on_target_import(module, all_targets())


def _on_ray_import(module: "ModuleType") -> None:
    from te_offload_shim.integrations import ray

    ray.on_ray_import(module)


def _on_ray_actors_import(module: "ModuleType") -> None:
    from te_offload_shim.integrations import ray

    ray.on_function_manager_import(module)


def all_targets() -> "tuple[Target, ...]":
    """The built-in table plus `TE_OFFLOAD_SHIM_TARGETS`, as installed (or as they would be)."""
    from te_offload_shim.integrations.targets import BUILTIN, parse_user_targets

    if _installed:
        return (*BUILTIN, *_user_targets)
    from te_offload_shim import _switches

    return (*BUILTIN, *parse_user_targets(_switches.user_targets())[0])


def _any_switch_set() -> bool:
    # With no switch set, the defaults hold and `_switches` need not be loaded at start-up.
    return any(name.startswith("TE_OFFLOAD_SHIM") for name in os.environ)


def install() -> bool:
    """Watch every target module and patch it on import (at once if already imported).

    Idempotent and thread-safe; never waits for another thread's import. Returns False when
    `TE_OFFLOAD_SHIM=0`."""
    global _installed, _user_targets
    switches: ModuleType | None = None
    if _any_switch_set():
        from te_offload_shim import _switches

        if not _switches.enabled():
            return False
        switches = _switches
    with _lock:
        if _installed:
            return True
        user: tuple[Target, ...] = ()
        if switches is not None:
            user = _read_switches(switches)
        _user_targets = user
        _installed = True  # what engine.registry.active() reads: patches may land from here on
        _watch.set_error_handler(_on_hook_error)
        for module in dict.fromkeys((*BUILTIN_MODULES, *(t.module for t in user))):
            _watch.watch(module, _on_import)
        _watch.watch(_RAY, _on_ray_import)
        _watch.watch(_RAY_ACTORS, _on_ray_actors_import)
    return True


def _read_switches(switches: "ModuleType") -> "tuple[Target, ...]":
    """User targets from `TE_OFFLOAD_SHIM_TARGETS`, and a warning for every switch we cannot use."""
    user: tuple[Target, ...] = ()
    if switches.user_targets():
        from te_offload_shim.integrations.targets import parse_user_targets

        parsed, problems = parse_user_targets(switches.user_targets())
        user = tuple(parsed)
        _problems[:] = problems
        for problem in problems:
            _warn(f"user-target:{problem}", "te_offload_shim: ignoring %s entry %s", switches.TARGETS, problem)
    names: tuple[str, ...] = ()
    if switches.disabled_targets():  # the names it holds are checked against the table's
        from te_offload_shim.integrations.targets import BUILTIN

        names = tuple(t.name for t in (*BUILTIN, *user))
    for problem in switches.switch_problems(names):
        _warn(f"switch:{problem}", "te_offload_shim: %s", problem)
    return user


def uninstall() -> int:
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


def installed() -> bool:
    return _installed


def status() -> "Status":
    """What this process has: switches, and for each target whether it is imported and patched."""
    if _installed:
        _watch.catch_up()
    from te_offload_shim.engine.status import status as status_

    return status_(all_targets(), _installed, list(_problems), list(_hook_errors))


def stats() -> "Stats":
    """Totals so far in this process: calls, entries, bytes (and per target); `audit`: the latest
    residue report of `TE_OFFLOAD_SHIM_AUDIT` (None until one ran)."""
    from te_offload_shim.engine.status import stats as stats_

    return stats_()


def clear_fp8_workspaces(models: object, *, strict: "bool | None" = None) -> "CacheReport":
    """Drop TE's cached FP8 weight copies in `models` now; returns what was cleared and skipped."""
    from te_offload_shim.te.caches import clear_fp8_workspaces as clear

    return clear(models, strict=strict)


def scan(models: object) -> "CacheReport":
    """What `clear_fp8_workspaces(models)` would clear, changing nothing."""
    from te_offload_shim.te.caches import scan as scan_

    return scan_(models)


def residue(models: object, *, device_type: "str | None" = None) -> "ResidueReport":
    """What `models` still hold on a device (any but the CPU, or exactly `device_type`), by
    category, each storage once; with the process's allocator and driver numbers. Changes nothing."""
    from te_offload_shim.reports.residue import residue as residue_

    return residue_(models, device_type=device_type)


def ray_setup() -> None:
    """For `runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"}`. Never raises:
    a raising setup hook kills the Ray worker."""
    try:
        install()
    except Exception as exc:  # pragma: no cover - install() itself fails open
        try:
            _warn("ray-setup", "te_offload_shim: ray_setup failed: %r", exc)
        except Exception:  # not even logging may fail the worker
            pass


_EXPORTED_TYPES = {
    "CacheReport": "te_offload_shim.te.caches",
    "Skipped": "te_offload_shim.te.caches",
    "ShimError": "te_offload_shim.te.caches",
    "ResidueReport": "te_offload_shim.reports.residue",
    "Status": "te_offload_shim.engine.status",
    "Stats": "te_offload_shim.engine.status",
    "TargetRow": "te_offload_shim.engine.status",
    "TargetState": "te_offload_shim.engine.status",
}


def __getattr__(name: str) -> object:
    # The report types load with their modules, on first use: not at start-up.
    module = _EXPORTED_TYPES.get(name)
    if module is None:
        raise AttributeError(f"module 'te_offload_shim' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


def _after_fork_in_child() -> None:
    global _lock
    _lock = _thread.RLock()


if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)

install()
