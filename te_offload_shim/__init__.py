"""te_offload_shim: drop Transformer Engine's cached FP8 weight copies when a Megatron model is
offloaded, in verl < 0.9, Megatron's own offload and the other Megatron RL frameworks.

`import te_offload_shim` installs the shim: it watches for the target modules and wraps their
offload functions when they are imported. `TE_OFFLOAD_SHIM=0` turns the package into a no-op.
`install`, `installed` and `ray_setup` are defined here; `uninstall`, `status`, `stats`, `scan`,
`clear_fp8_workspaces` and `residue` in `te_offload_shim.api`, exported here.

This module is the facade: it installs the one import hook (`_hook.HOOK`, which owns the install
state) and names, as `module:function` strings, what runs later, so that start-up loads nothing but
the hook and the standard library every interpreter has loaded already. Everything else is imported
when a target module is, or when a public name is first read.
"""

import os

from te_offload_shim._hook import HOOK, resolve
from te_offload_shim._version import __version__ as __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    # The one import of a layer above start-up, for type checkers only (pyproject.toml's contracts
    # list it): `__getattr__` loads the real functions on first use.
    from te_offload_shim.api import clear_fp8_workspaces, residue, scan, stats, status, uninstall
    from te_offload_shim.engine.states import Stats, Status, TargetRow, TargetState
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.report import CacheReport, ShimError, Skipped


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
# that start-up does not load the table; tests/startup/test_layout.py fails when the two disagree.
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
    "siirl.utils.megatron.megatron_utils",
    "siirl.engine.reward_model.megatron.reward_model",
    "siirl.workers.reward_model.megatron.reward_model",
    "relax.backends.megatron.actor",
    "relax.backends.megatron.weight_update.train_offload",
)
# What runs when a watched module has been imported, named rather than imported (as wrapt's string
# hooks are). Ray's come first: integrations/ray.py tells the engine how to see through a
# `@ray.remote` class, which must happen before a table module that imports Ray is patched (what
# is due at install fires in this order).
PATCH_TARGETS = "te_offload_shim.integrations.table:patch_target_module"
WATCH = {
    "ray": "te_offload_shim.integrations.ray:on_ray_import",  # ray.init gains our worker setup hook
    "ray._private.function_manager": "te_offload_shim.integrations.ray:on_function_manager_import",  # actor classes
    # the flush net: TE's base module class notes its layers, torch.cuda.empty_cache clears the offloaded ones
    "transformer_engine.pytorch.module.base": "te_offload_shim.integrations.flush:on_te_import",
    **dict.fromkeys(BUILTIN_MODULES, PATCH_TARGETS),
}
SWITCH_PREFIX = "TE_OFFLOAD_SHIM"


def install() -> bool:
    """Watch every target module and patch it on import (at once if already imported).

    Idempotent and thread-safe; never waits for another thread's import. Returns False when
    `TE_OFFLOAD_SHIM=0`."""
    if HOOK.installed:
        return True
    user_targets: tuple = ()
    problems: list[str] = []
    names = [name for name in os.environ if name.startswith(SWITCH_PREFIX)]
    if names:  # with none set the defaults hold, and `_switches` need not load
        from te_offload_shim import _switches as s

        if not s.enabled():
            return False
        # Only a switch that names targets needs the table (or a bad value or name, a warning): most do not.
        if s.user_targets() or s.disabled_targets() or not all(map(s.understood, names)):
            user_targets = resolve("te_offload_shim.integrations.user_targets:read_at_install")(problems, names)
    # the user's modules after the table's, by the table's callback
    watched = {**WATCH, **{t.module: PATCH_TARGETS for t in user_targets if t.module not in WATCH}}
    HOOK.install(watched, user_targets=user_targets, problems=problems)
    return True


def installed() -> bool:
    return HOOK.installed


def ray_setup() -> None:
    """For `runtime_env={"worker_process_setup_hook": "te_offload_shim.ray_setup"}`. Never raises:
    a raising setup hook kills the Ray worker."""
    try:
        install()  # a no-op where importing the package installed it; again after an uninstall()
    except Exception as exc:  # a broken install: said, never raised into the worker
        try:
            resolve("te_offload_shim._log:warn_once")("ray-setup", "te_offload_shim: ray_setup failed: %r", exc)
        except Exception:  # not even logging may fail the worker
            pass


# --- the rest of the public names: loaded on first use (PEP 562) ----------------------------------

EXPORTS = {
    **dict.fromkeys(("uninstall", "clear_fp8_workspaces", "residue", "scan", "stats", "status"), "te_offload_shim.api"),
    **dict.fromkeys(("CacheReport", "Skipped", "ShimError"), "te_offload_shim.te.report"),
    "ResidueReport": "te_offload_shim.reports.residue",
    **dict.fromkeys(("Status", "Stats", "TargetRow", "TargetState"), "te_offload_shim.engine.states"),
}


def __getattr__(name: str) -> object:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'te_offload_shim' has no attribute {name!r}")
    value = resolve(f"{module}:{name}")
    globals()[name] = value  # from now on a plain attribute
    return value


def __dir__() -> "list[str]":
    # What a user may rely on (`__all__`, the names docs/api.md describes) and the dunders every
    # module has; the tables, the imported modules and `TYPE_CHECKING` stay reachable, unlisted.
    return sorted({*__all__, *(name for name in globals() if name[:2] == name[-2:] == "__")})


install()
