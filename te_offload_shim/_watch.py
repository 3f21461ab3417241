"""Post-import watcher: run callbacks right after a named module finishes executing.

Standard library only, so that installing the shim costs next to nothing in processes that never
import a target. What it promises, and how:

- It never blocks on another thread's import and never imports, executes or forces the load of a
  module itself (a lazily loaded module stays unloaded; a failed import is not retried).
- The normal path: a meta path finder that answers only for watched names, by asking the rest of
  the meta path exactly as the import system would (`importlib._bootstrap._find_spec`, legacy
  `find_module` finders included), and chains the loader it got so the callbacks run after the
  module body (`exec_module`, or `load_module` for a legacy loader). It stays on `sys.meta_path`,
  so `importlib.reload` of a target fires again.
- An import already running when a name is watched (on another thread, or the module that is
  importing the shim right now): its spec is told to run the callbacks when the import system
  marks it finished (`spec._initializing = False`, set at the end of every import since 3.4).
- Another finder put in front of ours: every time our finder is consulted it moves back to the
  front, and notices any watched module that finished loading without it (the fallback that also
  covers loaders we could not chain).
- `sys.meta_path` is replaced, never edited in place: another thread's import may be walking it.
- A callback never makes the import fail: its exception is handed to the error handler.
"""

import _frozen_importlib as _bootstrap  # importlib._bootstrap, loaded in every interpreter (even under -S)
import _thread
import _weakref
import os
import sys

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], None]

_callbacks: "dict[str, list[Callback]]" = {}
_fired: "dict[str, Any]" = {}  # name -> weak reference to the module object the callbacks ran for
# Not a `_locks.Lock`: this module is on the start-up path, where every module imported costs about
# 0.2 ms. The same rule holds: a forked child gets a fresh lock (see `_locks`).
_lock = _thread.RLock()
_on_error: "Callable[[str, BaseException], None] | None" = None
_ModuleSpec = _bootstrap.ModuleSpec
# Callbacks running on this thread: a callback that imports (the patcher loads wrapt) can make
# another watched module come due; firing it right there would find our own modules half-built.
_local = _thread._local()


def set_error_handler(handler: "Callable[[str, BaseException], None]") -> None:
    global _on_error
    _on_error = handler


def _report(name: str, exc: BaseException) -> None:
    if _on_error is not None:
        try:
            _on_error(name, exc)
        except Exception:
            pass


def namespace(module: object) -> "dict[str, Any] | None":
    """A loaded module's namespace, read without running any of its code.

    A module loaded with `importlib.util.LazyLoader` executes on its first attribute access, and
    `__dict__` is an attribute: reading it through the module would import something the
    application never asked for. Such a module (and anything in sys.modules that is not a module)
    gives None."""
    if type(module).__name__ == "_LazyModule" or not isinstance(module, type(sys)):
        return None
    try:
        d = object.__getattribute__(module, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


def _module_state(module: object) -> tuple[dict | None, bool]:
    """(namespace, still executing) of a module in sys.modules, read without running its code."""
    d = namespace(module)
    if d is None:
        return None, False
    try:
        return d, bool(getattr(d.get("__spec__"), "_initializing", False))
    except Exception:
        return None, False


def _fire(name: str, module: "ModuleType") -> None:
    if getattr(_local, "firing", False):
        return  # inside a callback on this thread: it comes due, and runs when that one is done
    with _lock:
        callbacks = list(_callbacks.get(name, ()))
        try:
            _fired[name] = _weakref.ref(module)
        except TypeError:  # a module type without weak references: remember nothing, fire anyway
            _fired.pop(name, None)
    _run(name, module, callbacks)


def _run(name: str, module: "ModuleType", callbacks: "list[Callback]") -> None:
    _local.firing = True
    try:
        for callback in callbacks:
            try:
                callback(module)
            except Exception as exc:  # never let a hook fail the target's import
                _report(name, exc)
    finally:
        _local.firing = False
    _sweep(fire=True)  # what came due meanwhile


def _fired_for(name: str, module: object) -> bool:
    ref = _fired.get(name)
    return ref is not None and ref() is module


def _finished(name: str) -> None:
    """Run the callbacks for `name` if it is loaded, finished, and they have not run for it."""
    module = sys.modules.get(name)
    if module is None or _fired_for(name, module) or name not in _callbacks:
        return
    d, initializing = _module_state(module)
    if d is None:
        return  # not loaded yet (lazy), or not a module we can read safely
    if initializing:
        _notify_when_done(d.get("__spec__"))
        return
    _fire(name, module)


def _sweep(fire: bool) -> bool:
    """The fallback: watched modules that are loading or loaded without our loader seeing them.

    One still executing gets its spec tagged (its callbacks run when it finishes). One finished is
    fired when `fire`; otherwise the return value says one is due. Inside a finder we must not
    fire: the import system holds its global lock around `find_spec`, and a callback that imports
    (wrapt, on the first patch) could wait on a thread that waits on that lock."""
    due = False
    for name in list(_callbacks):
        module = sys.modules.get(name)
        if module is None or _fired_for(name, module):
            continue
        d, initializing = _module_state(module)
        if d is None:
            continue
        if initializing:
            _notify_when_done(d.get("__spec__"))
        elif fire:
            try:
                _fire(name, module)
            except Exception as exc:
                _report(name, exc)
        else:
            due = True
    return due


class _SpecWatch(_ModuleSpec):  # type: ignore[valid-type,misc]
    """Set as the class of a spec whose import is running: the import system's own
    `spec._initializing = False` at the end of it runs our callbacks (its own, and any that came
    due meanwhile), on the importing thread, outside the global import lock, without anyone
    waiting for anyone. The spec gets its own class back right then."""

    @property
    def _initializing(self) -> bool:
        return bool(self.__dict__.get("_initializing", False))

    @_initializing.setter
    def _initializing(self, value: bool) -> None:
        self.__dict__["_initializing"] = value
        if value:
            return
        try:
            self.__class__ = _ModuleSpec  # type: ignore[assignment]
            module = sys.modules.get(self.name)
            if module is not None and getattr(module, "__spec__", None) is self:
                _finished(self.name)  # a failed import left no module: nothing runs
            _sweep(fire=True)
        except Exception as exc:
            _report(self.name, exc)


def _notify_when_done(spec: object) -> None:
    if type(spec) is _ModuleSpec:  # a finder's own spec subclass is left alone: the sweep covers it
        try:
            spec.__class__ = _SpecWatch
        except TypeError:
            pass


class _ChainedLoader:
    """Runs the real loader, then the callbacks; hands the real loader back to the module."""

    def __init__(self, loader: "Any", name: str) -> None:
        self._loader = loader
        self._name = name

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)

    def create_module(self, spec: object) -> "ModuleType | None":
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        # Nothing after this point should see our proxy (pkgutil, importlib.resources, a reload).
        try:
            module.__loader__ = self._loader
        except Exception:  # a module type whose __loader__ is read-only keeps ours: harmless
            pass
        spec = getattr(module, "__spec__", None)
        if getattr(spec, "loader", None) is self:
            try:
                spec.loader = self._loader  # type: ignore[union-attr]
            except Exception:
                pass
        self._loader.exec_module(module)
        _fire(self._name, module)


class _ChainedLegacyLoader:
    """The same for a loader that only has `load_module` (no `exec_module` here, on purpose: the
    import system picks the protocol by looking for it)."""

    def __init__(self, loader: "Any", name: str) -> None:
        self._loader = loader
        self._name = name

    def __getattr__(self, name: str) -> object:
        if name == "exec_module":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def load_module(self, fullname: str) -> "ModuleType":
        module = self._loader.load_module(fullname)
        _fire(self._name, module)
        return module


class _Finder:
    """A meta path finder that only ever answers for watched names, by asking the others."""

    def __init__(self) -> None:
        self._searching = _thread._local()

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if not _callbacks:
            return None
        meta_path = sys.meta_path
        if meta_path and meta_path[0] is not self:
            _to_front()
        due = _sweep(fire=False)
        watched = fullname in _callbacks
        if not watched and not due:
            return None
        searching = self._searching.__dict__.setdefault("names", set())
        if fullname in searching:
            return None  # our own search below: let the rest of the meta path answer
        searching.add(fullname)
        try:
            spec = _bootstrap._find_spec(fullname, path, target)  # type: ignore[attr-defined]
        finally:
            searching.discard(fullname)
        if spec is None:
            return None
        if due:
            _notify_when_done(spec)  # the due callbacks run when this import finishes
        loader = spec.loader
        if not watched or loader is None or isinstance(loader, (_ChainedLoader, _ChainedLegacyLoader)):
            return spec
        if hasattr(loader, "exec_module"):
            spec.loader = _ChainedLoader(loader, fullname)
        elif hasattr(loader, "load_module"):
            spec.loader = _ChainedLegacyLoader(loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass


_finder = _Finder()


def _to_front() -> None:
    # A new list, not an edit: an import on another thread may be iterating the old one.
    with _lock:
        if not _callbacks:
            return
        sys.meta_path = [_finder, *(f for f in sys.meta_path if f is not _finder)]


def watch(name: str, callback: "Callback") -> None:
    """Call `callback(module)` after `name` is imported, and at once if it already is (or when it
    finishes, if its import is running now). Never waits, never imports."""
    with _lock:
        callbacks = _callbacks.setdefault(name, [])
        if callback not in callbacks:
            callbacks.append(callback)
        if not sys.meta_path or sys.meta_path[0] is not _finder:
            sys.meta_path = [_finder, *(f for f in sys.meta_path if f is not _finder)]
        module = sys.modules.get(name)
    if module is None:
        return
    d, initializing = _module_state(module)
    if d is None:
        return  # lazily imported and not loaded yet: the sweep sees it once it is
    if initializing:
        _notify_when_done(d.get("__spec__"))
        return
    if getattr(_local, "firing", False):
        return  # install() from inside a callback: the sweep after it runs this one
    if len(callbacks) == 1:
        try:
            _fired[name] = _weakref.ref(module)
        except TypeError:
            pass
    _run(name, module, [callback])


def catch_up() -> None:
    """Run the callbacks of any watched module that finished loading unseen (status() calls it)."""
    _sweep(fire=True)


def unwatch_all() -> None:
    """Drop every callback and take the finder off the meta path."""
    with _lock:
        _callbacks.clear()
        _fired.clear()
        sys.meta_path = [f for f in sys.meta_path if f is not _finder]


def _after_fork_in_child() -> None:
    global _lock
    _lock = _thread.RLock()


if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
