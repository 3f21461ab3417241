"""The switches that name targets, read once when the shim installs: `TE_OFFLOAD_SHIM_TARGETS`
(parsed by the engine's schema) and `TE_OFFLOAD_SHIM_DISABLE` (its names checked against the table),
with one warning for each entry or value that cannot be used.

`install()` calls `read_at_install` only when one of those two is set, or when another switch has a
value it cannot read: a process with no switch set never loads this module, the table or logging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_offload_shim import _switches

if TYPE_CHECKING:
    from te_offload_shim.engine.schema import Target


def read_at_install(problems: list[str]) -> tuple[Target, ...]:
    """The user targets of TE_OFFLOAD_SHIM_TARGETS, as `install()` takes them; a warning for each
    entry and each switch we cannot use. `problems` is refilled with the ignored entries."""
    user: tuple[Target, ...] = ()
    warnings: list[tuple[str, str]] = []  # (warn-once key, text)
    if _switches.user_targets():
        from te_offload_shim.engine.schema import parse_user_targets

        parsed, ignored = parse_user_targets(_switches.user_targets())
        user = tuple(parsed)
        problems[:] = ignored
        warnings += [(f"user-target:{p}", f"ignoring {_switches.TARGETS} entry {p}") for p in ignored]
    names: tuple[str, ...] = ()
    if _switches.disabled_targets():  # the names it holds are checked against the table's
        from te_offload_shim.integrations.targets import BUILTIN

        names = tuple(t.name for t in (*BUILTIN, *user))
    warnings += [(f"switch:{p}", p) for p in _switches.switch_problems(names)]
    if warnings:  # logging is imported only when there is something to say
        from te_offload_shim._log import warn_once

        for key, text in warnings:
            warn_once(key, "te_offload_shim: %s", text)
    return user
