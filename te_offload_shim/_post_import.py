"""The post-import hook, the half that fires: attaching a watched module's callbacks to its import,
and running them.

The first half is `_Watcher` in `te_offload_shim/__init__.py`, on the start-up path: the meta path
finder that notices a watched module. It loads this module the first time one turns up, and hands
it the module's spec (`attach`): the spec's loader is chained, or the spec is tagged, so that
`fire` runs right after the module's body.

- The callbacks run once per module object (a new module object, or a reload, runs them again).
- A callback never makes the import fail: its exception goes to the watcher's `on_error`.
- Callbacks do not nest on one thread: a callback that imports another watched module (the patcher
  loads wrapt) would find our own modules half-built; that module's callbacks run right after.
- The watcher's lock is never held while a callback runs.

This module can load inside the finder's `find_spec`, where the import system holds its global
lock. So the package loads it by hand (`_load_post_import`), never by an import statement, and its body
imports only what every interpreter has loaded before it runs, like the package's `__init__`
(annotations are quoted for the same reason).
"""

import _frozen_importlib as _bootstrap
import _thread
import _weakref
import sys

TYPE_CHECKING = False

if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from te_offload_shim import Callback

# The package, from sys.modules rather than imported: this module may load while the package's own
# import is still running on another thread, and an import statement would wait for it to finish.
_shim = sys.modules["te_offload_shim"]
_watcher = _shim._watcher
_module_state = _shim._module_state
_same = _shim._same
_ModuleSpec = _bootstrap.ModuleSpec


def attach(spec: "Any", name: str, watched: bool, unseen: bool) -> None:
    """Called by the finder with the spec of the import under way: `watched` when it is a watched
    module (its loader gets chained), `unseen` when a watched module loaded without our loader
    seeing it (the spec is tagged, and that module fires when this import ends)."""
    if unseen:
        tag(spec)
    loader = spec.loader
    if watched and loader is not None and not isinstance(loader, _Chained):
        if hasattr(loader, "exec_module"):
            spec.loader = ChainedLoader(loader, name)
        elif hasattr(loader, "load_module"):
            spec.loader = ChainedLegacyLoader(loader, name)


def tag(spec: object) -> None:
    """Have the import system's own `spec._initializing = False`, at the end of the import, run the
    callbacks. A finder's own spec subclass is left alone: the sweep covers it."""
    if type(spec) is _ModuleSpec:
        try:
            spec.__class__ = SpecWatch
        except TypeError:
            pass


class SpecWatch(_ModuleSpec):  # type: ignore[valid-type,misc]
    """The class of a tagged spec: the import system's `_initializing = False` at the end of its
    import runs our callbacks (its own, and any that came due meanwhile), on the importing thread,
    outside the global import lock, without anyone waiting for anyone. The spec gets its own class
    back right then."""

    @property
    def _initializing(self) -> bool:
        return bool(self.__dict__.get("_initializing", False))

    @_initializing.setter
    def _initializing(self, value: bool) -> None:
        self.__dict__["_initializing"] = value
        if value:
            return
        held = self.__dict__.pop(_HELD, None)
        try:
            self.__class__ = _ModuleSpec  # type: ignore[assignment]
            module = sys.modules.get(self.name)
            if module is not None and getattr(module, "__spec__", None) is self:
                finished(self.name)  # a failed import left no module: nothing runs
            sweep()
        except Exception as exc:
            if _from_signal_handler(exc):
                raise
            report(self.name, exc)
        if held is not None:
            raise held  # see ChainedLoader.exec_module


# Where a chained loader leaves the exception of the application's signal handler for the end of
# the import (a key of the spec's __dict__ no attribute of the import system uses).
_HELD = "_te_offload_shim_raise"


class _Chained:
    """A watched module's real loader, and the name whose callbacks run once it has executed."""

    def __init__(self, loader: "Any", name: str) -> None:
        self._loader = loader
        self._name = name


class ChainedLoader(_Chained):
    """Runs the real loader, then the callbacks; hands the real loader back to the module."""

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
        try:
            fire(self._name, module)
        except Exception as exc:  # only the application's own signal handler's exception gets here
            # The module's body has run: without the shim the exception would have reached the
            # application after this import. Raised here, it would make the import fail and the
            # module go; so it is raised at the import's very end, the module loaded (and its
            # callbacks due again), from `_initializing = False`. Where the spec cannot be tagged,
            # it is raised now.
            if spec is None or type(spec) is not _ModuleSpec:
                raise
            tag(spec)
            if type(spec) is not SpecWatch:
                raise
            spec.__dict__[_HELD] = exc


class ChainedLegacyLoader(_Chained):
    """The same for a loader that only has `load_module` (no `exec_module` here, on purpose: the
    import system picks the protocol by looking for it)."""

    def __getattr__(self, name: str) -> object:
        if name == "exec_module":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def load_module(self, fullname: str) -> "ModuleType":
        module = self._loader.load_module(fullname)
        fire(self._name, module)
        return module


def arrived(name: str, callback: "Callback") -> None:
    """`callback` was just added for `name`, which is in sys.modules: run it now if the module is
    loaded and finished, or when its import finishes."""
    module = sys.modules.get(name)
    if module is None or not _ready(name, module):
        return
    if _thread.get_ident() in _watcher.firing:
        return  # install() from inside a callback: the sweep after it runs this one
    if len(_watcher.callbacks.get(name, ())) == 1:
        _watcher.mark_fired(name, module)
    _run(name, module, (callback,))


def fire(name: str, module: "ModuleType", callbacks: "tuple[Callback, ...] | None" = None) -> None:
    """Run every callback of `name` for `module` (or only `callbacks`), once."""
    if _thread.get_ident() in _watcher.firing:
        return  # inside a callback on this thread: it comes due, and runs when that one is done
    with _watcher.lock:
        if callbacks is None:
            callbacks = _watcher.callbacks.get(name, ())
        _watcher.mark_fired(name, module)
    _run(name, module, callbacks)


def finished(name: str) -> None:
    """Run the callbacks for `name` if it is loaded, finished, and they have not run for it."""
    module = sys.modules.get(name)
    if module is None or _watcher.fired_for(name, module) or name not in _watcher.callbacks:
        return
    if _ready(name, module) and _due(name):
        fire(name, module, _pending(name, module))


def _ready(name: str, module: object) -> bool:
    """Whether `module` has finished loading. One still executing gets its spec tagged (it fires when
    it finishes); a lazily imported one not loaded yet, or one we cannot read safely, waits for the
    sweep. In a forked child, one whose callbacks a thread gone with the fork was running counts as
    finished (`_Watcher.cut_short`)."""
    d, initializing = _module_state(module)
    if d is None:
        return False
    if initializing and not _same(_watcher.cut_short, name, module):
        tag(d.get("__spec__"))
        return False
    return True


def sweep(retry: bool = True, occasion: bool = False) -> None:
    """Fire every watched module that finished loading without our loader seeing it (`status()`
    calls it too, as a new `occasion`), and retry callbacks that raised, if an import began since
    (`retry`)."""
    for name, module in _watcher.loaded_unseen(occasion):
        if not (_due(name) if retry else name not in _watcher.failures):
            continue
        try:
            fire(name, module, _pending(name, module))
        except Exception as exc:
            if _from_signal_handler(exc):
                raise
            report(name, exc)


def unwatch_all() -> None:
    """Drop every callback and take the finder off the meta path."""
    _watcher.stop()


def report(name: str, exc: BaseException) -> None:
    """Hand a callback's exception to the watcher's `on_error` (by default: `status()` lists it,
    and it is logged once); nothing the handler does escapes."""
    try:
        (_watcher.on_error or _hook_error)(name, exc)
    except Exception:
        pass


def _from_signal_handler(exc: BaseException) -> bool:
    """Whether `exc` is the application's own, raised by its signal handler while a callback ran:
    it goes on to the application instead of being taken for the callback's failure."""
    try:  # loaded as this module is (by hand), an import here being what may have been interrupted
        signals = _shim._load_post_import("te_offload_shim._signals")
    except Exception:  # a broken install: a failure of the callback, as before
        return False
    return bool(signals.raised_by_signal_handler(exc))


def _hook_error(module: str, exc: BaseException) -> None:
    from te_offload_shim._log import warn_once

    _shim._failed(module, exc)  # for status(): the install state has one owner
    warn_once(
        f"hook:{module}",
        "te_offload_shim: patching %s failed (%s); it runs unpatched until a retry succeeds",
        module,
        _describe(exc),
    )


# Callbacks that raised (a signal handler's exception arriving while they ran, a bug) run again at
# the first sweep after an import began since (the end of that import, or `status()`), up to this
# many attempts per module object; until one succeeds, their failure says why, and the status rows of
# the module's targets say `error`. Only the callbacks that raised run again.
ATTEMPTS = 5


class Failure:
    """The callbacks of one module object that raised, waiting to run again."""

    __slots__ = ("attempts", "callbacks", "generation", "module", "why")

    def __init__(self, why: str, attempts: int, callbacks: "tuple[Callback, ...]", module: "Any") -> None:
        self.why = why
        self.attempts = attempts
        self.callbacks = callbacks
        self.module = module  # () -> the module object (a weak reference where the type allows one)
        self.generation = _watcher.generation  # imports begun so far: the retry waits for one more

    @property
    def retried(self) -> bool:
        return self.attempts < ATTEMPTS


def _due(name: str) -> bool:
    """Whether a sweep may fire `name` now: no callback of it failed, or an import began since one
    did (so the sweeps that follow a failure, in the same import, cannot spend every attempt)."""
    failure = _watcher.failures.get(name)
    return failure is None or failure.generation != _watcher.generation


def _pending(name: str, module: object) -> "tuple[Callback, ...] | None":
    """The callbacks that raised for this very module object (None: all of them)."""
    failure = _watcher.failures.get(name)
    if failure is None or failure.module() is not module:
        return None
    registered = _watcher.callbacks.get(name, ())
    return tuple(c for c in failure.callbacks if c in registered)


def _run(name: str, module: "ModuleType", callbacks: "tuple[Callback, ...]") -> None:
    thread = _watcher.begin_firing(name)
    failed: list[tuple[Callback, BaseException]] = []
    ran = [0]  # how many of them ran: what is left when something is on its way out
    try:
        _call_each(name, module, callbacks, failed, ran)
    except BaseException as exc:  # KeyboardInterrupt, SystemExit, a signal handler's: on its way
        failed += [(c, exc) for c in callbacks[ran[0] :]]
        raise
    finally:
        _settle(name, module, failed, _watcher.end_firing(thread, name))
    sweep(retry=False)  # what came due meanwhile


def _call_each(
    name: str, module: "ModuleType", callbacks: "tuple[Callback, ...]", failed: "list[Any]", ran: "list[int]"
) -> None:
    # The loop lives here, not inside `_run`'s `try`: on CPython 3.11 - 3.13 an exception that a
    # signal handler raises at a loop's back-edge can miss the handlers of a `try` in the same frame
    # (python/cpython#108214, #130279), and the `finally` that ends the firing would not run. Raised
    # in this frame, it reaches `_run`'s `try` through the call, which it covers.
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # never let a hook fail the target's import
            if _from_signal_handler(exc):
                raise  # the application's, on its way to it; still due again (`_run`)
            failed.append((callback, exc))
            report(name, exc)
        ran[0] += 1


def _settle(name: str, module: "ModuleType", failed: "list[tuple[Callback, BaseException]]", earlier: "Any") -> None:
    # Runs in a `finally`: never raises. `earlier`: the failure this firing was the retry of, or None.
    if not failed:
        return
    attempts = earlier.attempts + 1 if earlier is not None and earlier.module() is module else 1
    try:
        ref: Any = _weakref.ref(module)
    except TypeError:
        ref = lambda: module  # noqa: E731  (a module type without weak references)
    failure = Failure(_describe(failed[-1][1]), attempts, tuple(c for c, _ in failed), ref)
    _watcher.note_failure(name, failure, failure.retried and _watcher.fired_for(name, module))


def free_imports_cut_short(me: int, gone: "dict[int, str]") -> None:
    """In a forked child: free the imports of the shim's that threads gone with the fork left half
    done. `gone`: thread -> the watched module whose callbacks it was running.

    `os.fork()` copies `importlib._bootstrap._module_locks` as they are, so a module another thread
    was importing stays locked, by a thread that does not exist here, and the next import of it
    waits forever. Freed, for the thread that owned the lock:
    - the shim's own modules still executing: dropped from sys.modules, so the child loads them
      afresh (their half-run bodies are of no use);
    - a watched module whose callbacks that thread was running: its body had run (callbacks run
      after it), so its import is marked finished, as the thread would have; its callbacks are due
      again (`_Watcher.cut_short`);
    - any module that thread began importing after it (what the callbacks imported: wrapt, the
      engine): dropped like ours.
    The application's own imports in flight that led there are left as they are, as without the
    shim."""
    locks = getattr(_bootstrap, "_module_locks", None)
    if not locks:
        return
    ours = _shim.__name__ + "."
    held = {}
    for name, ref in list(locks.items()):
        owner = getattr(ref(), "owner", None)
        if owner is not None and owner != me:
            held[name] = (owner, ref)
    # a thread whose callbacks ran for a module already loaded (no lock of it held): all it holds
    # was imported from inside them
    inside = {t for t, name in gone.items() if held.get(name, (None,))[0] != t}
    for name, (owner, ref) in held.items():
        if gone.get(owner) == name:
            _finish_cut_short(name)
            inside.add(owner)
        elif name.startswith(ours) or owner in inside:
            module = sys.modules.get(name)
            if module is not None and _module_state(module)[1]:
                del sys.modules[name]
        else:
            continue
        if locks.get(name) is ref:
            del locks[name]  # the next import of it makes a new lock


def _finish_cut_short(name: str) -> None:
    # What the import system does at the end of an import the fork cut short: the spec says
    # "finished" (written to its namespace, past a tag's setter), and the parent package holds it.
    module = sys.modules.get(name)
    d = _shim._module_namespace(module)
    spec = d.get("__spec__") if d is not None else None
    if spec is None:
        return
    if type(spec) is SpecWatch:
        spec.__class__ = _ModuleSpec  # type: ignore[assignment]
    vars(spec)["_initializing"] = False
    parent, _, child = name.rpartition(".")
    namespace = _shim._module_namespace(sys.modules.get(parent)) if parent else None
    if namespace is not None and child not in namespace:
        namespace[child] = module


def failures() -> "dict[str, tuple[str, int, bool]]":
    """module -> (why its callbacks raised, attempts, whether they run again), for `status()`."""
    return {name: (f.why, f.attempts, f.retried) for name, f in list(_watcher.failures.items())}


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises
        return type(exc).__name__
