"""Post-import watcher: run callbacks right after a named module finishes executing.

Standard library only, so that installing the shim costs next to nothing in processes that never
import a target. Unlike wrapt's post-import hooks it stays on `sys.meta_path`, so an
`importlib.reload` of a target module fires the callbacks again (reload asks the meta path anew).
A callback never makes the import fail: its exception is handed to `on_error`.
"""

import _thread
import sys

TYPE_CHECKING = False  # typing costs milliseconds at every interpreter start

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], None]

_callbacks: "dict[str, list[Callback]]" = {}
_lock = _thread.RLock()
_searching = _thread._local()
_on_error: "Callable[[str, BaseException], None] | None" = None


def set_error_handler(handler: "Callable[[str, BaseException], None]") -> "None":
    global _on_error
    _on_error = handler


def _run(name: "str", module: "ModuleType", callback: "Callback") -> "None":
    try:
        callback(module)
    except Exception as exc:  # never let a hook fail the target's import
        if _on_error is not None:
            try:
                _on_error(name, exc)
            except Exception:
                pass


def _fire(name: "str", module: "ModuleType") -> "None":
    with _lock:
        callbacks = list(_callbacks.get(name, ()))
    for callback in callbacks:
        _run(name, module, callback)


class _ChainedLoader:
    """Runs the real loader, then the callbacks; hands the real loader back to the module."""

    def __init__(self, loader: "Any") -> "None":
        self._loader = loader

    def __getattr__(self, name: "str") -> "object":
        return getattr(self._loader, name)

    def create_module(self, spec: "object") -> "ModuleType | None":
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> "None":
        # Nothing after this point should see our proxy, e.g. pkgutil or a later reload.
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _fire(module.__name__, module)


class _Finder:
    """A meta path finder that only ever answers for watched names, by asking the others."""

    def find_spec(self, fullname: "str", path: "Any" = None, target: "Any" = None) -> "Any":
        if fullname not in _callbacks:
            return None
        searching = _searching.__dict__.setdefault("names", set())
        if fullname in searching:
            return None
        searching.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            searching.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            spec.loader = _ChainedLoader(loader)
        return spec

    def invalidate_caches(self) -> "None":
        pass


_finder = _Finder()


def _ensure_finder() -> "None":
    if not any(f is _finder for f in sys.meta_path):
        sys.meta_path.insert(0, _finder)


def _importing_elsewhere(name: "str") -> "bool":
    """True while some thread holds the import lock of `name` (its import began before we were
    on the meta path, so our loader will not see it finish)."""
    module = sys.modules.get(name)
    if module is not None:
        return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
    locks = getattr(sys.modules.get("importlib._bootstrap"), "_module_locks", {})
    ref = locks.get(name)
    return ref is not None and ref() is not None


def watch(name: "str", callback: "Callback") -> "None":
    """Call `callback(module)` after `name` is imported, and at once if it already is."""
    with _lock:
        _callbacks.setdefault(name, [])
        if callback not in _callbacks[name]:
            _callbacks[name].append(callback)
        _ensure_finder()
    if _importing_elsewhere(name):
        # Wait on the module's own import lock for the other thread to finish. On this thread
        # (a circular import) this returns the half-built module, which we must not patch.
        import importlib

        try:
            importlib.import_module(name)
        except Exception:
            return  # the application's import failed; it will see that itself
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        _run(name, module, callback)


def unwatch_all() -> "None":
    """Drop every callback and take the finder off the meta path."""
    with _lock:
        _callbacks.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if f is not _finder]
