"""Every patch the package makes, as a record that can recognise, disarm and undo itself.

The one source of truth for `status()` and `uninstall()`: a table target, `ray.init`, Ray's
actor-class loaders and the actor method copies are all records here, and a new kind of patch is a
new record, never a new teardown path. A record is added *before* the patch takes effect, so that
whatever interrupts the patching (an exception, a fork) leaves something `uninstall()` can undo.

Disarming comes before restoring: a wrapper we cannot take back out (something wrapped it after
us, a copy we never saw) reads its record's `armed` flag at every call and then steps aside.
Standard library only.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from te_offload_shim import _hook
from te_offload_shim._locks import Lock
from te_offload_shim._reload import kept

if TYPE_CHECKING:
    from typing import Any

    from te_offload_shim.engine.states import TargetState

# The state below is what the wrappers in place are, so it outlives a reload of this module
# (`kept`): else uninstall() could not undo them, status() would not know them, and a patch on
# another thread during the reload would hold a second lock.
lock = kept(globals(), "lock", Lock)  # held across a whole patch: check, record, put in place
_records: list[Record] = kept(globals(), "_records", list)
_states: dict[str, tuple[TargetState, str]] = kept(globals(), "_states", dict)


ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()  # an `original` the owner did not have


class Record:
    """One patch: `owner.name` was `original` and now is `replacement`.

    `kind` is the kind of patch ("target" for a table entry, Ray's "ray.init", "ray-loader",
    "actor-copy"). `aliases`: module globals elsewhere that held `original` were pointed at
    `replacement` too (module-level functions), so undoing it points every global that holds
    `replacement` back. `handler`: what a call of `replacement` runs (for a target, its
    `engine.handler.Handler`, which Ray's actor copies reuse). An `original` of `ABSENT`: the owner
    had no such attribute of its own, and restoring deletes ours."""

    __slots__ = ("aliases", "armed", "handler", "kind", "name", "original", "owner", "replacement", "target")

    def __init__(
        self, kind: str, owner: Any, name: str, original: Any, *, target: str | None = None, aliases=False
    ) -> None:
        self.kind = kind
        self.owner = owner
        self.name = name
        self.original = original
        self.replacement: Any = None
        self.target = target
        self.aliases = aliases
        self.armed = True
        self.handler: Any = None

    def in_place(self) -> bool:
        """Whether the owner still holds our replacement (nothing replaced it since)."""
        return vars(self.owner).get(self.name) is self.replacement  # a module or a class (`add` set it)

    def restore(self) -> bool:
        """Put the original back where our replacement still sits; True if the owner had it."""
        restored = self.in_place()
        if restored:
            if self.original is ABSENT:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.original)
        if self.aliases:
            rebind(self.replacement, self.original)
        return restored

    def __repr__(self) -> str:
        return f"Record({self.kind!r}, {self.name!r}, target={self.target!r}, armed={self.armed})"


def rebind(old: object, new: object) -> None:
    """Point every module global that holds `old` at `new`.

    Patching: `from X import f` made before the patch holds the original. Unpatching: one made
    after it holds the wrapper, whether or not we ever saw that module."""
    for module in list(sys.modules.values()):
        d = _hook.namespace(module)  # lazy modules are skipped: they hold no aliases yet
        if d is None:
            continue
        try:
            keys = [k for k, v in list(d.items()) if v is old]
        except RuntimeError:  # a module being filled on another thread: its aliases come later
            continue
        for key in keys:
            d[key] = new


def active() -> bool:
    """Whether the shim is installed, as the import hook, its one owner, says. `uninstall()` clears
    the flag first, then takes this lock in `deactivate()`, so a patch either lands before and is
    undone, or sees the flag and does not land."""
    return _hook.HOOK.installed


def add(record: Record, replacement: Any) -> bool:
    """Record `record`, then put `replacement` in place (`owner.name`, and every alias of the
    original where `record.aliases`: the mirror of `Record.restore`), under the registry lock;
    False (and nothing done) once the shim is uninstalled, so no patch lands after that."""
    with lock:
        if not active():
            return False
        record.replacement = replacement
        _records.append(record)
        setattr(record.owner, record.name, replacement)
        if record.aliases:
            rebind(record.original, replacement)
        return True


def records(kind: str | None = None) -> list[Record]:
    with lock:
        return [r for r in _records if kind is None or r.kind == kind]


def set_state(target: str, state: TargetState, detail: str = "") -> None:
    with lock:
        _states[target] = (state, detail)


def state(target: str) -> tuple[TargetState, str] | None:
    with lock:
        return _states.get(target)


def deactivate() -> tuple[int, list[str]]:
    """Disarm every record, then undo each (newest first). Returns (attributes restored, errors):
    one patch that cannot be undone does not keep the others in place."""
    with lock:
        taken = list(_records)
        for record in taken:
            record.armed = False
        _records.clear()
        _states.clear()
    restored = 0
    errors: list[str] = []
    for record in reversed(taken):
        try:
            restored += record.restore()
        except Exception as exc:
            errors.append(f"{record.kind} {record.name}: {type(exc).__name__}: {exc}")
    return restored, errors
