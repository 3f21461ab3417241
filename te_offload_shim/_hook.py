"""The post-import hook: run a callback, named `module:function`, right after a watched module's body.

One object, `HOOK`, holds all of its state. It is a meta path finder of the shape wrapt's
`importer.py` and ddtrace's `ModuleWatchdog` share: it answers for a watched name by asking the
finders behind it, and chains the loader it gets so that the callback runs on the importing thread
once the body has run. A module imported before it was watched, or loaded without our loader (another
finder in front of ours, a lazy loader, an import already running at install), fires at the end of
the process's next import instead (`due`).

Rules it keeps:
- It never fails an import: a callback's exception is recorded (`errors`) and logged once. Only what
  the application's own signal handler raised goes on, as it would have from the module's last line.
- Callbacks run outside the hook's lock, as wrapt's do: a callback may start a thread that imports a
  watched module and wait for it (wrapt's import-deadlock tests), and under the lock that thread
  would wait on us. The lock guards only the hook's own state; `claimed` keeps a module's callback
  from running twice at once.
- Nothing is imported inside `find_spec`, where the import system holds its global lock; callbacks
  import the shim's own modules after the body, where only that module's lock is held.
- A fork waits for callbacks in flight on other threads (at most 5 s): a child must never inherit a
  module of ours half imported, whose import lock no thread of the child can release.
- `sys.meta_path` is replaced, never edited: another thread's import may be iterating it.

Standard library only, and only modules every interpreter has loaded before it runs: it is part of
what `import te_offload_shim` loads.
"""

import _thread
import os
import sys
from time import monotonic, sleep

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

_ModuleType = type(sys)
# A module's own namespace, read through ModuleType's descriptor: a subclass's `__dict__` or
# `__getattribute__` (a lazy module's) never runs.
_MODULE_DICT = vars(_ModuleType)["__dict__"]
_PLAIN_GETATTRIBUTE = _ModuleType.__getattribute__
FORK_WAIT_S = 5.0


def namespace(module: object) -> "dict[str, Any] | None":
    """A loaded module's namespace, read without running any of its code. None for anything that is
    not a module, and for a module whose attribute reads run code: a lazily loaded module whose body
    has not run yet (reading it would import something the application never asked for)."""
    cls = type(module)
    if not issubclass(cls, _ModuleType) or cls.__getattribute__ is not _PLAIN_GETATTRIBUTE:
        return None
    return _MODULE_DICT.__get__(module)  # a dict, or None for a module made by `__new__` alone (3.10)


def finished(module: object) -> bool:
    """Whether `module`'s body has run to its end, read without running any of its code."""
    d = namespace(module)
    try:
        spec = d.get("__spec__") if d is not None else None
        # Python 3.12+'s LazyLoader imports `threading` after the module is in sys.modules and before
        # it makes the module lazy: while its spec still names the LazyLoader, nothing has run.
        lazy = getattr(sys.modules.get("importlib.util"), "LazyLoader", ())  # isinstance(x, ()) is False
        # `_initializing`: the import system's mark of a module whose body runs; no public API says so
        loader = getattr(spec, "loader", None)
        return d is not None and not getattr(spec, "_initializing", False) and not isinstance(loader, lazy)
    except Exception:
        return False


def resolve(spec: str) -> "Any":
    """`module:function`, imported now (never inside `find_spec`)."""
    name, _, function = spec.partition(":")
    __import__(name)
    return getattr(sys.modules[name], function)


class ImportHook:
    """The post-import hook. `install` watches a table (module -> `module:function`), `uninstall`
    stops; `installed`, `errors`, `user_targets` and `problems` are what the rest of the package reads.
    Written only by its own methods."""

    def __init__(self) -> None:
        self._lock = _thread.RLock()
        self.installed = False
        self.watched: dict[str, str] = {}  # replaced, never edited: find_spec reads it without the lock
        self.user_targets: tuple[Any, ...] = ()  # TE_OFFLOAD_SHIM_TARGETS as parsed at install
        self.problems: list[str] = []  # TE_OFFLOAD_SHIM_TARGETS entries that were ignored
        self.errors: dict[str, str] = {}  # module -> why its callback failed
        self._fired: dict[str, object] = {}  # name -> the module object its callback ran for
        self._claimed: dict[str, tuple[object, bool]] = {}  # name -> (the module fired now, ran again meanwhile)
        self._flights: set[int] = set()  # the threads running callbacks now
        self._searching: set[tuple[int, str]] = set()  # (thread, name) it asks the finders behind us for
        self._depth: dict[int, int] = {}  # per thread: chained imports running, outside in
        self._forking: dict[int, bool] = {}  # per thread: a fork in progress, and whether it holds the lock
        self._register_fork_hooks()  # sets _fork_hooks_after_logging

    # --- lifecycle ---------------------------------------------------------------------------

    def install(
        self, watched: "Mapping[str, str]", *, user_targets: "Iterable[Any]" = (), problems: "Iterable[str]" = ()
    ) -> bool:
        """Watch `watched` (in its order: what is due at once fires in it) and fire what is imported
        already. False when installed already."""
        with self._lock:
            if self.installed:
                return False
            self.user_targets, self.problems = tuple(user_targets), list(problems)
            self.watched = dict(watched)
            self.installed = True
            self._to_front()
        self._fire(None, None, 0)  # the watched modules imported before: at once
        return True

    def uninstall(self, restore: "Callable[[], int]") -> int:
        """Stop watching and take the finder off the meta path, then `restore()` (undo what the
        callbacks did), under the lock still, so that an install on another thread waits for it."""
        with self._lock:
            self.installed = False
            self.watched = {}
            self._fired.clear()
            sys.meta_path = self._meta_path_without()
            return restore()

    # --- the finder ---------------------------------------------------------------------------

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        watched = self.watched
        if not watched:
            return None
        meta_path = sys.meta_path
        if not meta_path or meta_path[0] is not self:
            self._to_front()  # another finder went in front (pytest's rewriter): chain the next one again
        is_watched = fullname in watched
        if not is_watched and not self._due():
            return None
        key = (_thread.get_ident(), fullname)
        if key in self._searching:
            return None  # our own look-up below, come back: the finders behind us answer
        self._searching.add(key)
        try:
            spec = self._find_behind(fullname, path, target)
        finally:
            self._searching.discard(key)
        loader = getattr(spec, "loader", None)
        if hasattr(loader, "exec_module") and not (type(loader) is ChainedLoader and loader._hook is self):
            spec.loader = ChainedLoader(self, loader, fullname if is_watched else None)
        return spec

    def _find_behind(self, fullname: str, path: "Any", target: "Any") -> "Any":
        """What the rest of the meta path answers, asked as the import system asks it."""
        for finder in self._meta_path_without():
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
            elif sys.version_info < (3, 12) and hasattr(finder, "find_module"):
                # A legacy finder, which 3.10 and 3.11 still ask in its turn: skipping it would hand
                # its module to a finder behind it. Rare enough to import the public helper here.
                loader = finder.find_module(fullname, path)
                from importlib.util import spec_from_loader

                spec = None if loader is None else spec_from_loader(fullname, loader)
            else:
                continue
            if spec is not None:
                return spec
        return None

    def _to_front(self) -> None:
        sys.meta_path = [self, *self._meta_path_without()]

    def _meta_path_without(self) -> "list[Any]":
        return [other for other in sys.meta_path if other is not self]

    # --- firing -------------------------------------------------------------------------------

    def _fire(self, name: "str | None", module: "Any", nested: int) -> None:
        """The callback of `name`, whose body has just run in `module`, then of every module due.

        What is due fires only at the end of this thread's outermost chained import (`nested` 0):
        inside another module's import that module is half built. A thread already running callbacks
        does not nest (what it imports fires when its callback returns), and an import chained only
        for what is due (`name` None) leaves it to a thread that is running callbacks now: that one
        may be importing the very module a callback here would need."""
        me = _thread.get_ident()
        if me in self._flights or (name is None and (nested or self._flights)):
            return
        with self._lock:
            self._flights.add(me)
        try:
            if name is not None:
                self._run(name, module)
            while not nested and (due := self._due()):
                self._run(*due[0])
        finally:
            self._flights.discard(me)  # no lock: a fork waiting for it may see it go a poll later, no harm

    def _run(self, name: str, module: "Any") -> None:
        """`name`'s callback, outside the lock, unless another thread runs it for `module` now;
        recorded fired only once it returned, so that one an interrupt cut short is due again."""
        with self._lock:
            spec = self.watched.get(name)  # None: not watched, or uninstalled meanwhile
            # Its body ran again (a reload) while its callback runs elsewhere: not twice at once, but
            # marked, so that one's end leaves it due, and it runs once more.
            again = self._claimed.get(name, (None,))[0] is module
            if again or spec is not None:
                self._claimed[name] = (module, again)
            if again or spec is None:
                return
        returned = False
        try:
            self._callback(name, spec, module)
            returned = True
        finally:
            with self._lock:
                claim = self._claimed.get(name, (None, False))
                if claim[0] is module:
                    del self._claimed[name]
                # not recorded after a reload meanwhile (due again), nor over a new object's own record
                if returned and not claim[1] and self.installed and sys.modules.get(name) is module:
                    self._fired[name] = module

    def _callback(self, name: str, spec: str, module: "Any") -> None:
        if not self._fork_hooks_after_logging:
            __import__("logging")  # the callbacks load it anyway
            self._register_fork_hooks()
        try:
            resolve(spec)(module)
        except Exception as exc:  # a hook never fails the import (never strict), but for the application's own
            why = type(exc).__name__
            try:
                why = resolve("te_offload_shim._log:describe_error")(exc)
                resolve("te_offload_shim._log:fail_open")(
                    exc, f"hook:{name}", "te_offload_shim: patching failed (%s: %s)", name, why, strict=False
                )
            except Exception as raised:  # a broken install, or logging that fails: recorded all the same
                if raised is exc:
                    raise  # what the application's signal handler raised, on its way to it
            self.errors[name] = why

    def _due(self) -> "list[tuple[str, Any]]":
        """Watched modules loaded and finished whose callback has not run for that module object, in
        the watch table's order. Runs at each import: the set operation is C. `watched` is read
        once: an install or uninstall on another thread replaces it meanwhile."""
        watched, fired, claimed = self.watched, self._fired, self._claimed
        found = []
        for name in watched.keys() & sys.modules.keys():
            module = sys.modules.get(name)
            if fired.get(name) is not module and claimed.get(name, (None,))[0] is not module and finished(module):
                found.append((name, module))
        if len(found) > 1:
            order = list(watched)
            found.sort(key=lambda item: order.index(item[0]))
        return found

    # --- fork ---------------------------------------------------------------------------------

    def _fork_before(self) -> None:
        """Wait (at most FORK_WAIT_S) for other threads' callbacks in flight, then hold the lock across
        the fork: a callback stuck longer is the application's hang, not one to spread to the child."""
        me = _thread.get_ident()
        if me in self._forking:  # the hooks are registered more than once: one wait per fork
            return
        deadline = monotonic() + FORK_WAIT_S
        while True:
            held = self._lock.acquire(timeout=max(deadline - monotonic(), 0.0))
            if not held or not self._flights - {me} or monotonic() >= deadline:
                break
            self._lock.release()  # the callbacks in flight take it when they end
            sleep(0.001)
        self._forking[me] = held

    def _fork_parent(self) -> None:
        if self._forking.pop(_thread.get_ident(), False):
            self._lock.release()

    def _fork_child(self) -> None:
        me = _thread.get_ident()
        self._forking.clear()
        self._lock = _thread.RLock()  # free whatever the parent's other threads held (the wait ran out)
        # Only this thread exists here: the others' callbacks never end in the child, so their modules
        # are due again (a callback of this thread's own, if it forked inside one, records itself as it
        # returns), and their per-thread marks go, in place: this thread may be inside `_fire`.
        self._claimed.clear()
        self._flights &= {me}
        self._searching -= {key for key in self._searching if key[0] != me}
        for thread in [thread for thread in self._depth if thread != me]:
            del self._depth[thread]

    def _register_fork_hooks(self) -> None:
        # `before` hooks run in the reverse order of registration, and logging's takes logging's
        # module lock, which a callback that calls `logging.getLogger` needs: so ours are registered
        # again once logging is loaded, and run before it.
        self._fork_hooks_after_logging = "logging" in sys.modules
        if hasattr(os, "register_at_fork"):  # POSIX
            os.register_at_fork(
                before=self._fork_before, after_in_parent=self._fork_parent, after_in_child=self._fork_child
            )


class ChainedLoader:
    """The real loader, then the hook's callback of `name` (None: chained only to fire what is due).
    Everything else of the real loader is read through."""

    def __init__(self, hook: ImportHook, loader: "Any", name: "str | None") -> None:
        # underscored: every other attribute is the real loader's (a loader has a `name` of its own)
        self._hook, self._loader, self._name = hook, loader, name

    def __getattr__(self, name: str) -> "Any":
        return getattr(self.__dict__["_loader"], name)

    def exec_module(self, module: "Any") -> None:
        # The real loader back before the body runs: nothing that outlives the import sees ours
        # (pkgutil, importlib.resources, a reload). A module type that refuses keeps ours: harmless.
        for owner, attribute in ((module, "__loader__"), (getattr(module, "__spec__", None), "loader")):
            try:
                if getattr(owner, attribute, None) is self:
                    setattr(owner, attribute, self._loader)
            except Exception:
                pass
        hook, me = self._hook, _thread.get_ident()
        depth = hook._depth.get(me, 0)
        hook._depth[me] = depth + 1
        try:
            self._loader.exec_module(module)
        finally:
            if depth:
                hook._depth[me] = depth
            else:
                hook._depth.pop(me, None)
        hook._fire(self._name, module, depth)


# One hook per process. A reload of this module keeps the one on sys.meta_path (a second would fire
# every callback twice).
HOOK: ImportHook = globals().get("HOOK") or ImportHook()
