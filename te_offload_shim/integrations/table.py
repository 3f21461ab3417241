"""Where the table meets the engine: `patch_target_module`, the callback the start-up's watch table
names for the table's modules (and those of `TE_OFFLOAD_SHIM_TARGETS`), and `all_targets`, what it
patches: the built-in table plus the user's targets, as installed (or as they would be).

Loaded by the first table module's import, never at start-up, and not by `import ray` alone (not
the package's `__init__`): a training process loads it without the public API (`api`), which
re-exports `all_targets` for `status` and the health report. `all_targets` returns the engine's
`Target`, which is no public type: the package does not export it, and `status()`'s rows say the
same to a user. The install state is the import hook's (`_hook.HOOK`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_offload_shim._hook import HOOK
from te_offload_shim.integrations.targets import BUILTIN

if TYPE_CHECKING:
    from types import ModuleType

    from te_offload_shim.engine.schema import Target


def all_targets() -> tuple[Target, ...]:
    """The built-in table plus `TE_OFFLOAD_SHIM_TARGETS`, as installed (or as they would be)."""
    if HOOK.installed:
        return (*BUILTIN, *HOOK.user_targets)
    from te_offload_shim import _switches
    from te_offload_shim.integrations.user_targets import parse_user_targets

    return (*BUILTIN, *parse_user_targets(_switches.user_targets())[0])


def patch_target_module(module: ModuleType) -> None:
    """The start-up's callback for a target module: patch the targets that live in it. (The engine's
    patching, and wrapt with it, load here: `all_targets` alone, which `status` reads, loads neither.)"""
    from te_offload_shim.engine.patch import patch_targets_in

    patch_targets_in(module, all_targets())
