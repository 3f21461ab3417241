"""te_offload_shim: drop Transformer Engine's cached FP8 weight copies when a Megatron model is
offloaded, in verl < 0.9, Megatron's own offload and the other Megatron RL frameworks.

`import te_offload_shim` installs the shim: it watches for the target modules and wraps their
offload functions when they are imported. `TE_OFFLOAD_SHIM=0` turns the package into a no-op.
`uninstall`, `status`, `stats`, `scan`, `clear_fp8_workspaces`, `residue` and `ray_setup` are
defined in `te_offload_shim.api` and exported here.
"""

# This module is the whole start-up path: all that `import te_offload_shim` loads, and it imports
# only modules every interpreter has loaded before it runs. A second module of ours would cost
# about 0.2 ms more to find and read, at every interpreter start of a cluster whose image imports
# the shim from a .pth file. So `install()` and the post-import hook it puts on `sys.meta_path` live
# here, and everything else is imported when a target module is, or when asked for: the API
# (`api`), the table, the engine, TE's layouts, wrapt. `_switches` joins only when a
# TE_OFFLOAD_SHIM* variable is set. The same budget explains the habits of this file: what
# explains the code is a comment, not a docstring (docstrings are loaded at every start); the
# private functions' types are type comments, which mypy reads and start-up does not (annotations
# are built at each `def`, some 1k instructions each; the public functions keep theirs), and names
# that exist only for type checkers are quoted (`typing` costs milliseconds and `from __future__`
# imports a module); every `def` (and, up to 3.11, comprehension) is a code object to unmarshal at
# each start, so the rarely run code (fork, reload) loops rather than comprehends; and what most
# processes never run (chaining a loader, running callbacks, uninstall, the reports) lives in
# modules loaded on first use.

import _frozen_importlib as _bootstrap  # importlib._bootstrap, loaded in every interpreter (even under -S)
import _frozen_importlib_external as _bootstrap_external
import _thread
import _weakref
import os
import sys

TYPE_CHECKING = False

# `importlib.reload(te_offload_shim)` (IPython's autoreload, a plugin reloader) runs this file again
# in the same namespace. What the package held then is kept, not dropped: the install state below
# (`_kept`), and the watcher's, which a new watcher takes over (`_take_over`, end of file); else a
# second watcher stayed behind, and `uninstall()` removed one of them.
_reloading = "_watcher" in globals()
_kept = globals().copy() if _reloading else {}

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from te_offload_shim.engine.schema import Target
    from te_offload_shim.engine.states import Stats, Status, TargetRow, TargetState
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.report import CacheReport, ShimError, Skipped

    Callback = Callable[[ModuleType], None]

    # The functions of `api`, as type checkers see them here (`__getattr__` loads the real ones).
    # Declared rather than imported: `api` reads this module's install state, so even a type-only
    # import of it would make a cycle; the modules above, imported for their types, never import this
    # one. tests/startup/test_layout.py checks that these say what api.py's own signatures say.
    def uninstall() -> int: ...
    def status() -> Status: ...
    def stats() -> Stats: ...
    def clear_fp8_workspaces(models: object, *, strict: bool | None = None) -> CacheReport: ...
    def scan(models: object) -> CacheReport: ...
    def residue(models: object, *, device_type: str | None = None) -> ResidueReport: ...
    def ray_setup() -> None: ...


__version__ = "0.7.0.dev0"
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
# What runs when a watched module has been imported: `module:function`, called with the module,
# named rather than imported (as wrapt's string hooks are), so that start-up loads none of them.
# Ray's come first: integrations/ray.py tells the engine how to see through a `@ray.remote` class
# when it loads, which must happen before a table module that imports Ray has its targets patched
# (`install()` runs the callbacks of modules imported before it in this order).
_PATCH_TARGETS = "te_offload_shim.api:patch_target_module"
WATCH = {
    "ray": "te_offload_shim.integrations.ray:on_ray_import",  # ray.init gains our worker setup hook
    "ray._private.function_manager": "te_offload_shim.integrations.ray:on_function_manager_import",  # actor classes
    # the flush net: TE's base module class notes its layers, torch.cuda.empty_cache clears the offloaded ones
    "transformer_engine.pytorch.module.base": "te_offload_shim.integrations.flush:on_te_import",
    **dict.fromkeys(BUILTIN_MODULES, _PATCH_TARGETS),
}
# WATCH plus the modules of TE_OFFLOAD_SHIM_TARGETS, as installed
_watched: "dict[str, str]" = _kept.get("_watched", {})
_READ_SWITCHES = "te_offload_shim.integrations.user_targets:read_at_install"

# --- install, and the install state (this module is its one owner; others read it through the
# functions below) ---------------------------------------------------------------------------------

_lock = _kept.get("_lock") or _thread.RLock()  # serialises install and uninstall; replaced in a forked child
_installed: bool = _kept.get("_installed", False)
_user_targets: "tuple[Target, ...]" = _kept.get("_user_targets", ())
_problems: "list[str]" = _kept.get("_problems", [])  # TE_OFFLOAD_SHIM_TARGETS entries that were ignored, for status()
_hook_errors: "list[str]" = _kept.get("_hook_errors", [])  # patching a target module failed, for status()


def install() -> bool:
    """Watch every target module and patch it on import (at once if already imported).

    Idempotent and thread-safe; never waits for another thread's import. Returns False when
    `TE_OFFLOAD_SHIM=0`."""
    global _installed, _user_targets, _watched
    switches: ModuleType | None = None
    if _any_switch_set():  # with none set the defaults hold, and `_switches` need not load
        from te_offload_shim import _switches

        if not _switches.enabled():
            return False
        switches = _switches
    with _lock:
        if _installed:
            return True
        _user_targets = ()
        # Only a switch that names targets needs the table (or a bad value or name, a warning): most do not.
        if switches is not None and (
            switches.user_targets()
            or switches.disabled_targets()
            or switches.switch_problems(())
            or switches.unknown_names()
        ):
            _user_targets = _resolve(_READ_SWITCHES)(_problems)
        _installed = True  # what engine.registry.active() reads: patches may land from here on
        watched = dict(WATCH)
        for target in _user_targets:
            watched.setdefault(target.module, _PATCH_TARGETS)
        _watched = watched  # replaced, never edited: a callback on another thread may be reading it
        _watcher.watch(_on_import, *watched)
    return True


def installed() -> bool:
    return _installed


def _state():  # type: () -> tuple[bool, tuple[Target, ...], list[str], list[str]]
    # For api.py: (installed, user targets, ignored TE_OFFLOAD_SHIM_TARGETS entries, hook errors).
    return _installed, _user_targets, list(_problems), list(_hook_errors)


def _uninstall(restore):  # type: (Callable[[BaseException | None], int]) -> int
    # The state half of api.uninstall(), under the install lock: the flag first (engine.registry
    # reads installed() under its own lock, so a patch in flight lands before and is undone, or does
    # not land), then the watcher; `restore(error of unwatching, or None)` last, under the lock still.
    global _installed
    with _lock:
        _installed = False
        error = None
        try:
            _load_post_import().unwatch_all()
        except Exception as exc:
            error = exc
        return restore(error)


def _any_switch_set():  # type: () -> bool
    # Iterating os.environ decodes every name (about 1 us each, and a cluster job sets hundreds);
    # CPython's os.environ keeps the encoded names in `_data`, which is scanned as it is.
    names = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if type(names) is not dict or encode is None:
        names, encode = os.environ, str
    prefix = encode("TE_OFFLOAD_SHIM")
    for name in names:
        if name.startswith(prefix):
            return True
    return False


def _on_import(module):  # type: (ModuleType) -> None
    spec = getattr(module, "__spec__", None)
    name = spec.name if spec is not None else module.__name__
    _resolve(_watched.get(name, _PATCH_TARGETS))(module)


def _resolve(spec):  # type: (str) -> Any
    # `module:function` of ours, imported now (never inside find_spec: callbacks run after the body).
    name, _, function = spec.partition(":")
    __import__(name)
    return getattr(sys.modules[name], function)


# --- the rest of the public names: loaded on first use (PEP 562) ----------------------------------

_EXPORTS = {
    "uninstall": "te_offload_shim.api",
    "clear_fp8_workspaces": "te_offload_shim.api",
    "ray_setup": "te_offload_shim.api",
    "residue": "te_offload_shim.api",
    "scan": "te_offload_shim.api",
    "stats": "te_offload_shim.api",
    "status": "te_offload_shim.api",
    "CacheReport": "te_offload_shim.te.report",
    "Skipped": "te_offload_shim.te.report",
    "ShimError": "te_offload_shim.te.report",
    "ResidueReport": "te_offload_shim.reports.residue",
    "Status": "te_offload_shim.engine.states",
    "Stats": "te_offload_shim.engine.states",
    "TargetRow": "te_offload_shim.engine.states",
    "TargetState": "te_offload_shim.engine.states",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'te_offload_shim' has no attribute {name!r}")
    value = _resolve(f"{module}:{name}")
    globals()[name] = value  # from now on a plain attribute
    return value


def __dir__() -> "list[str]":
    # What a user may rely on (`__all__`, the names docs/api.md describes) and the dunders every
    # module has; the tables, the imported modules and `TYPE_CHECKING` stay reachable, unlisted.
    names = set(__all__)
    for name in globals():
        if name[:2] == name[-2:] == "__":
            names.add(name)
    return sorted(names)


# --- the post-import hook, the half that notices -------------------------------------------------
#
# `_watcher` runs callbacks right after a named module finishes executing. It is split in two: the
# half here must be on `sys.meta_path` from the start, and notices a watched module; `_post_import`
# attaches its callbacks to the import and runs them, and loads the first time a watched module turns up.
# What the two promise, and how:
#
# - Nothing blocks on another thread's import, and nothing imports, executes or forces the load of
#   a module itself (a lazily loaded module stays unloaded; a failed import is not retried).
# - The normal path: `_watcher` is a meta path finder that answers only for watched names, by
#   asking the rest of the meta path exactly as the import system would
#   (`importlib._bootstrap._find_spec`, legacy `find_module` finders included), and chains the
#   loader it got so the callbacks run after the module body (`exec_module`, or `load_module` for a
#   legacy loader). It stays on `sys.meta_path`, so `importlib.reload` of a target fires again.
# - An import already running when a name is watched (on another thread, or the module that is
#   importing the shim right now): its spec is tagged, to run the callbacks when the import system
#   marks it finished (`spec._initializing = False`, set at the end of every import since 3.4).
# - Another finder put in front of ours: every time ours is consulted it moves back to the front,
#   and notices any watched module that finished loading without it (the fallback that also covers
#   loaders we could not chain): the import under way gets its spec tagged.
# - `sys.meta_path` is replaced, never edited in place: another thread's import may be walking it.
# - No import statement runs inside `find_spec`: the import system holds its global lock there,
#   and an import that waits for a module lock held by a thread that waits for the global lock
#   would deadlock both. `_post_import` is loaded there by hand (`_load_post_import`), taking no lock, and its
#   body imports nothing an interpreter has not loaded already. Callbacks run after the module
#   body, outside that lock.

_POST_IMPORT = "te_offload_shim._post_import"


class _Watcher:
    def __init__(self):  # type: () -> None
        self.callbacks: dict[str, tuple[Callback, ...]] = {}  # replaced, never edited in place
        self.fired: dict[str, Any] = {}  # name -> weak reference to the module object its callbacks ran for
        # Never held while a callback runs or anything imports. Not a `_locks.Lock` (a module more
        # at start-up); replaced in a forked child all the same (end of file).
        self.lock = _thread.RLock()
        self.on_error: Callable[[str, BaseException], None] | None = None
        self.firing: dict[int, str] = {}  # thread -> the name whose callbacks it is running (see `_post_import`)
        self.searching: set[tuple[int, str]] = set()  # (thread, name): our own look-ups in find_spec
        # In a forked child: name -> weak reference to a module whose callbacks a thread that did
        # not survive the fork was running. Its body has run (callbacks run after it), but its
        # spec says "initializing" for good, since that thread's import never ends here.
        self.cut_short: dict[str, Any] = {}
        self.failures: dict[str, Any] = {}  # name -> `_post_import.Failure`: callbacks that raised, to run again
        self.generation = 0  # imports begun (find_spec calls while watching): a retry waits for the next

    def watch(self, callback, *names):  # type: (Callback, *str) -> None
        # `callback(module)` after each name is imported; at once for one already imported (or when
        # its import finishes, if it is running now). Never waits.
        alone = (callback,)  # one tuple shared by every name that has only this callback
        with self.lock:
            for name in names:
                callbacks = self.callbacks.get(name, ())
                if callback not in callbacks:
                    self.callbacks[name] = (*callbacks, callback) if callbacks else alone
            if not sys.meta_path or sys.meta_path[0] is not self:
                self._to_front()
        for name in dict.fromkeys(names):  # a user target may repeat a built-in module
            if name in sys.modules:
                firing = _post_import_or_none(name)
                if firing is not None:
                    firing.arrived(name, callback)

    def find_spec(self, fullname, path=None, target=None):  # type: (str, Any, Any) -> Any
        if not self.callbacks:
            return None
        self.generation += 1
        meta_path = sys.meta_path
        if meta_path and meta_path[0] is not self:
            with self.lock:
                if self.callbacks:
                    self._to_front()
        unseen = bool(self.loaded_unseen())
        watched = fullname in self.callbacks
        if not watched and not unseen:
            return None
        key = (_thread.get_ident(), fullname)
        if key in self.searching:
            return None  # our own search below: let the rest of the meta path answer
        self.searching.add(key)
        try:
            spec = _bootstrap._find_spec(fullname, path, target)  # type: ignore[attr-defined]
        finally:
            self.searching.discard(key)
        firing = None if spec is None else _post_import_or_none(fullname)
        if firing is not None:
            try:
                firing.attach(spec, fullname, watched, unseen)
            except Exception as exc:  # the module loads unwatched; status() shows why
                _failed(fullname, exc)
        return spec

    def _to_front(self):  # type: () -> None
        # Under self.lock.
        sys.meta_path = [self, *_meta_path_without(self)]

    def loaded_unseen(self, occasion=False):  # type: (bool) -> list[tuple[str, ModuleType]]
        # Watched modules loaded without our loader seeing them. One still executing gets its spec
        # tagged (its callbacks run when it finishes); the finished ones are returned, for
        # `_post_import.sweep` to fire (never from inside find_spec). An `occasion` (`status()`) counts
        # as an import begun: callbacks that raised are due again.
        if occasion:
            self.generation += 1
        found = []
        for name in list(self.callbacks):
            module = sys.modules.get(name)
            if module is None or self.fired_for(name, module):
                continue
            d, initializing = _module_state(module)
            if d is None:
                continue
            if initializing and not _same(self.cut_short, name, module):
                firing = _post_import_or_none(name)
                if firing is not None:
                    firing.tag(d.get("__spec__"))
            else:
                found.append((name, module))
        return found

    def fired_for(self, name, module):  # type: (str, object) -> bool
        return _same(self.fired, name, module)

    # What `_post_import` does to the watcher's state, each as one method: the state has one owner. As
    # few as the steps of a firing need (each `def` costs start-up time here, about 4k instructions
    # to unmarshal and make), so no setter of one field each.

    def mark_fired(self, name, module):  # type: (str, object) -> None
        # `name`'s callbacks run (or ran) for this very module object; a module type without weak
        # references is remembered as nothing, and fires anyway.
        try:
            self.fired[name] = _weakref.ref(module)
        except TypeError:
            self.fired.pop(name, None)

    def begin_firing(self, name):  # type: (str) -> int
        thread = _thread.get_ident()
        self.firing[thread] = name
        return thread

    def end_firing(self, thread, name):  # type: (int, str) -> Any
        # The firing on `thread` is over; the failure it was the retry of is handed back, taken (what
        # the callbacks did this time replaces it: `note_failure`, or nothing).
        self.firing.pop(thread, None)
        return self.failures.pop(name, None)

    def note_failure(self, name, failure, again):  # type: (str, Any, bool) -> None
        # Callbacks of `name` raised: `failure` runs them again, at a later sweep if `again` (the
        # module counts as not fired: `loaded_unseen` hands it on).
        if again:
            self.fired.pop(name, None)
        self.failures[name] = failure

    def stop(self):  # type: () -> None
        # No callbacks, nothing remembered, off the meta path (replaced, not edited: see above).
        with self.lock:
            self.callbacks, self.fired, self.failures = {}, {}, {}
            sys.meta_path = _meta_path_without(self)


def _meta_path_without(finder):  # type: (object) -> list[Any]
    # A new list, not an edit of sys.meta_path: an import on another thread may be iterating it.
    meta_path = []
    for other in sys.meta_path:
        if other is not finder:
            meta_path.append(other)
    return meta_path


def _same(refs, name, module):  # type: (dict[str, Any], str, object) -> bool
    ref = refs.get(name)
    return ref is not None and ref() is module


def _module_namespace(module):  # type: (object) -> dict[str, Any] | None
    # A loaded module's namespace, read without running any of its code. A module loaded with
    # `importlib.util.LazyLoader` executes on its first attribute access, and `__dict__` is an
    # attribute: reading it through the module would import something the application never
    # asked for. Such a module (and anything in sys.modules that is not a module) gives None.
    if type(module).__name__ == "_LazyModule" or not isinstance(module, type(sys)):
        return None
    try:
        d = object.__getattribute__(module, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


def _module_state(module):  # type: (object) -> tuple[dict | None, bool]
    # (namespace, still executing) of a module in sys.modules, read without running its code.
    d = _module_namespace(module)
    if d is None:
        return None, False
    try:
        return d, bool(getattr(d.get("__spec__"), "_initializing", False))
    except Exception:
        return None, False


def _post_import_or_none(name):  # type: (str) -> Any
    # `_post_import` for the watcher's own use, or None where it cannot load (a broken install): `name`
    # then loads unwatched, and status() says why. Nothing raises into an import or install().
    try:
        return _load_post_import()
    except Exception as exc:
        _failed(name, exc)
        return None


def _failed(name, exc):  # type: (str, BaseException) -> None
    # Recorded for status() only: this can run inside find_spec, where logging may not be imported.
    error = f"{name}: {type(exc).__name__}: {exc}"
    if error not in _hook_errors:
        _hook_errors.append(error)


def _load_post_import(name=_POST_IMPORT):  # type: (str) -> Any
    # `_post_import` (or a ground module it needs, standard library only), loaded without an import
    # statement, which would take its module lock (see above), nor the meta path. Two threads
    # racing here outside find_spec may each build one; the first in sys.modules is kept, and the
    # other is as good (all state lives in `_watcher`).
    module = sys.modules.get(name)
    if module is None:
        spec = _bootstrap_external.PathFinder.find_spec(name, __path__)
        if spec is None or spec.loader is None:
            raise ImportError(f"{name} not found in {__path__}")
        module = _bootstrap.module_from_spec(spec)  # type: ignore[attr-defined]
        spec.loader.exec_module(module)
        module = sys.modules.setdefault(name, module)
    return module


_watcher = _Watcher()


def _take_over(old, old_callback):  # type: (_Watcher, object) -> None
    # On a reload: this watcher takes over all the old one knew (its callbacks pointing at this
    # module's `_on_import`), the old one goes inert (no callbacks: its find_spec answers nothing)
    # and off the meta path, and `_post_import` is built again, for this watcher, at its next use.
    with old.lock:
        callbacks = {}
        for name, theirs in old.callbacks.items():
            ours: tuple[Any, ...] = ()
            for callback in theirs:
                ours += (_on_import if callback is old_callback else callback,)
            callbacks[name] = ours
        _watcher.callbacks = callbacks
        for name in ("fired", "firing", "searching", "cut_short", "failures", "generation", "on_error"):
            setattr(_watcher, name, getattr(old, name, getattr(_watcher, name)))
        old.callbacks = {}
    sys.modules.pop(_POST_IMPORT, None)
    sys.meta_path = _meta_path_without(old)
    if _watcher.callbacks:
        with _watcher.lock:
            _watcher._to_front()


if _reloading:
    _take_over(_kept["_watcher"], _kept.get("_on_import"))
del _kept


def _after_fork_in_child():  # type: () -> None
    # Only the forking thread lives on in the child, and the child's next new thread may get the id
    # of one that does not (glibc reuses the thread's stack, and its id with it): the watcher's
    # per-thread state of the others would make that thread's imports look like nested callbacks.
    # Their callbacks in flight never finish here, so those modules are due again (the next sweep).
    global _lock
    _lock = _thread.RLock()
    watcher = _watcher
    watcher.lock = _thread.RLock()
    me = _thread.get_ident()
    gone = dict(watcher.firing)
    mine = gone.pop(me, None)
    for name in gone.values():
        ref = watcher.fired.pop(name, None)
        if ref is not None:
            watcher.cut_short[name] = ref
    watcher.firing = {} if mine is None else {me: mine}
    searching = set()
    for key in watcher.searching:
        if key[0] == me:
            searching.add(key)
    watcher.searching = searching
    # Imports in flight at the fork: the import system copies their module locks as they are, held
    # by threads gone with it. `_post_import` frees those of the shim's own (`free_imports_cut_short`).
    if getattr(_bootstrap, "_module_locks", None):
        try:
            _load_post_import().free_imports_cut_short(me, gone)
        except Exception:  # the child goes on as it would have
            pass


if hasattr(os, "register_at_fork") and not _reloading:  # POSIX only; once (the handler reads the globals)
    os.register_at_fork(after_in_child=_after_fork_in_child)

install()
