"""The switches that name targets, read once when the shim installs: `TE_OFFLOAD_SHIM_TARGETS`
(parsed here into the engine's `Target`) and `TE_OFFLOAD_SHIM_DISABLE` (its names checked against the
table), with one warning for each entry or value that cannot be used, and for each `TE_OFFLOAD_SHIM*`
name that is no switch (naming the closest one: `TE_OFFLOAD_SHIM_DISABLED` would switch nothing off).
The checking of the switches as set lives here, next to the wording: `_switches` only reads them.

`install()` calls `read_at_install` only when one of those two is set, or when another switch has a
value it cannot read, or a name is no switch (`_switches.understood`): a process with no switch set
never loads this module, the table or logging; one that sets only known switches never loads it
either. `te-offload-shim status` (health.py) and `api.all_targets` before install use it too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from te_offload_shim import _switches

if TYPE_CHECKING:
    from collections.abc import Iterable

    from te_offload_shim.engine.schema import Target


def read_at_install(problems: list[str], names: Iterable[str]) -> tuple[Target, ...]:
    """The user targets of TE_OFFLOAD_SHIM_TARGETS, as `install()` takes them; a warning for each
    entry and each switch we cannot use. `names` are the `TE_OFFLOAD_SHIM*` variables set (the
    start-up module lists them); `problems` is refilled with the ignored entries."""
    user: tuple[Target, ...] = ()
    warnings: list[tuple[str, str]] = []  # (warn-once key, text)
    if _switches.user_targets():
        user, problems[:] = parse_user_targets(_switches.user_targets())
        warnings += [(f"user-target:{p}", f"ignoring {_switches.TARGETS} entry {p}") for p in problems]
    targets: tuple[str, ...] = ()
    if _switches.disabled_targets():  # the names it holds are checked against the table's
        from te_offload_shim.integrations.targets import BUILTIN

        targets = tuple(t.name for t in (*BUILTIN, *user))
    warnings += [(f"switch:{p}", p) for p in switch_problems(targets)]
    warnings += [(f"switch-name:{n}", unknown_switch_text(n, close)) for n, close in unknown_switches(names)]
    if warnings:  # logging is imported only when there is something to say
        from te_offload_shim._log import warn_once

        for key, text in warnings:
            warn_once(key, "te_offload_shim: %s", text)
    return user


def switch_problems(targets: tuple[str, ...]) -> list[str]:
    """What is wrong with the values of the switches as set: values we do not understand, and names
    in TE_OFFLOAD_SHIM_DISABLE that match none of `targets` (a misspelt name would disable nothing).
    The names that are no switch: `unknown_switches`."""
    problems = []
    for switch in _switches.VALUES:
        if _switches.understood(switch):
            continue
        if switch == _switches.LOG:
            value = os.environ[switch].strip()
            problems.append(f"{switch}={value!r} is not warning, info or debug; the shim's logging is left as it is")
        else:
            stays = "on" if _switches.FLAGS[switch] else "off"
            problems.append(
                f"{switch}={os.environ[switch]!r} is not 1/0 (true/false, yes/no, on/off); it stays {stays}"
            )
    for name in sorted(_switches.disabled_targets() - {"*"}):
        if not any(_switches.covers(name, n) for n in targets):
            problems.append(f"{_switches.DISABLE} names {name!r}, which is no target (known: {', '.join(targets)})")
    return problems


def unknown_switches(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """(name, the closest switch or None) for each of `names` (the `TE_OFFLOAD_SHIM*` variables set)
    that is no switch (misspelt, it does nothing), sorted."""
    unknown = sorted(name for name in names if name not in _switches.ALL_SWITCHES)
    if not unknown:
        return []
    import difflib

    # Compared without the prefix that every name shares, which would make any two names look alike.
    prefix = _switches.ENABLE
    by_suffix = {name[len(prefix) :].lstrip("_"): name for name in _switches.ALL_SWITCHES if name != prefix}
    found: list[tuple[str, str | None]] = []
    for name in unknown:
        close = difflib.get_close_matches(name[len(prefix) :].lstrip("_").upper(), by_suffix, n=1, cutoff=0.7)
        found.append((name, by_suffix[close[0]] if close else None))
    return found


def unknown_switch_text(name: str, closest: str | None) -> str:
    """`TE_OFFLOAD_SHIM_DISABLED is no switch ... (did you mean TE_OFFLOAD_SHIM_DISABLE?)`."""
    hint = f"did you mean {closest}?" if closest else f"the switches: {', '.join(_switches.ALL_SWITCHES)}"
    return f"{name} is no switch of te_offload_shim and does nothing ({hint})"


def parse_user_targets(text: str) -> tuple[tuple[Target, ...], list[str]]:
    """Parse `TE_OFFLOAD_SHIM_TARGETS`: `pkg.mod:func[@where],pkg.mod:Class.method[@where]`.

    Returns the good entries and one message per malformed entry (the others still work). Names are
    read as Python reads identifiers (NFKC, PEP 3131): an import statement naming a module in
    fullwidth letters imports the module of the same name in ASCII, and so does the entry."""
    from te_offload_shim.engine.schema import Target  # only where the variable is set

    if not text.isascii():  # ASCII as it is, without loading unicodedata
        import unicodedata

        text = unicodedata.normalize("NFKC", text)
    targets: list[Target] = []
    problems: list[str] = []
    for entry in [part.strip() for part in text.split(",") if part.strip()]:
        path, _, where = entry.partition("@")
        module, sep, attribute = path.partition(":")
        parts = attribute.split(".")
        try:
            if not sep or not all(p.isidentifier() for p in module.split(".")):
                raise ValueError("expected pkg.module:function or pkg.module:Class.method")
            if len(parts) > 2 or not all(p.isidentifier() for p in parts):
                raise ValueError("attribute must be function or Class.method")
            targets.append(Target(path, module, attribute, where, user=True))
        except ValueError as exc:
            problems.append(f"{entry!r}: {exc}")
    return tuple(targets), problems
