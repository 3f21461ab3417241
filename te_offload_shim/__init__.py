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
# imports a module).

import _thread
import os
import sys

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable  # noqa: F401  (read in type comments)
    from types import ModuleType  # noqa: F401  (read in type comments)
    from typing import Any  # noqa: F401  (read in type comments)

    from te_offload_shim.engine.schema import Target
    from te_offload_shim.engine.states import Stats, Status, TargetRow, TargetState
    from te_offload_shim.reports.residue import ResidueReport
    from te_offload_shim.te.report import CacheReport, ShimError, Skipped

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
_PATCH_TARGETS = "te_offload_shim.integrations.table:patch_target_module"
WATCH = {
    "ray": "te_offload_shim.integrations.ray:on_ray_import",  # ray.init gains our worker setup hook
    "ray._private.function_manager": "te_offload_shim.integrations.ray:on_function_manager_import",  # actor classes
    # the flush net: TE's base module class notes its layers, torch.cuda.empty_cache clears the offloaded ones
    "transformer_engine.pytorch.module.base": "te_offload_shim.integrations.flush:on_te_import",
    **dict.fromkeys(BUILTIN_MODULES, _PATCH_TARGETS),
}
# WATCH plus the modules of TE_OFFLOAD_SHIM_TARGETS, as installed; replaced, never edited: the
# finder reads it on every thread without a lock
_watched: "dict[str, str]" = {}
_READ_SWITCHES = "te_offload_shim.integrations.user_targets:read_at_install"

# --- install, and the install state (this module is its one owner; others read it through the
# functions below) ---------------------------------------------------------------------------------

# Serialises install, uninstall and the running of callbacks; a fork waits for it (end of file).
_lock = _thread.RLock()
_installed = False
_user_targets: "tuple[Target, ...]" = ()
_problems: "list[str]" = []  # TE_OFFLOAD_SHIM_TARGETS entries that were ignored, for status()
_hook_errors: "list[str]" = []  # patching a target module failed, for status()


def install() -> bool:
    """Watch every target module and patch it on import (at once if already imported).

    Idempotent and thread-safe; never waits for another thread's import. Returns False when
    `TE_OFFLOAD_SHIM=0`."""
    global _installed, _user_targets, _watched
    needs_table = False
    names = _switch_names()
    if names:  # with none set the defaults hold, and `_switches` need not load
        from te_offload_shim import _switches as s

        if not s.enabled():
            return False
        # Only a switch that names targets needs the table (or a bad value or name, a warning): most do not.
        needs_table = bool(s.user_targets() or s.disabled_targets() or not all(map(s.understood, names)))
    with _lock:
        if _installed:
            return True
        _user_targets = _resolve(_READ_SWITCHES)(_problems, names) if needs_table else ()
        _installed = True  # what engine.registry.active() reads: patches may land from here on
        watched = dict(WATCH)  # first: what is due at once fires in this order (_due)
        for target in _user_targets:  # the user's modules too, by the table's callback (WATCH's keep their own)
            watched.setdefault(target.module, _PATCH_TARGETS)
        _watched = watched
        _to_front()
        _fire()  # the watched modules imported before: at once
    return True


def installed() -> bool:
    return _installed


def _state():  # type: () -> tuple[bool, tuple[Target, ...], list[str], list[str]]
    # For api.py: (installed, user targets, ignored TE_OFFLOAD_SHIM_TARGETS entries, hook errors).
    return _installed, _user_targets, list(_problems), list(_hook_errors)


def _uninstall(restore):  # type: (Callable[[], int]) -> int
    # The state half of api.uninstall(), under the install lock: the flag first (engine.registry
    # reads installed() under its own lock, so a patch in flight lands before and is undone, or does
    # not land), then the finder; `restore()` last, under the lock still.
    global _installed, _watched
    with _lock:
        _installed = False
        _watched = {}
        _fired.clear()
        sys.meta_path = _meta_path_without()
        return restore()


def _switch_names():  # type: () -> list[str]
    # The TE_OFFLOAD_SHIM* names set. Iterating os.environ decodes every name (about 1 us each, and a
    # cluster job sets hundreds); CPython's os.environ keeps the encoded names in `_data`, which is
    # scanned as it is: only ours are decoded.
    names = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    decode = getattr(os.environ, "decodekey", None)
    if type(names) is not dict or encode is None or decode is None:
        names, encode, decode = os.environ, str, str
    prefix = encode("TE_OFFLOAD_SHIM")
    return [decode(name) for name in names if name.startswith(prefix)]


def _resolve(spec):  # type: (str) -> Any
    # `module:function` of ours, imported now (never inside find_spec: callbacks run after the body).
    name, _, function = spec.partition(":")
    __import__(name)
    return getattr(sys.modules[name], function)


# --- the rest of the public names: loaded on first use (PEP 562) ----------------------------------

_API = "te_offload_shim.api"
_EXPORTS = {
    **dict.fromkeys(("uninstall", "clear_fp8_workspaces", "ray_setup", "residue", "scan", "stats", "status"), _API),
    **dict.fromkeys(("CacheReport", "Skipped", "ShimError"), "te_offload_shim.te.report"),
    "ResidueReport": "te_offload_shim.reports.residue",
    **dict.fromkeys(("Status", "Stats", "TargetRow", "TargetState"), "te_offload_shim.engine.states"),
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
    return sorted({*__all__, *(name for name in globals() if name[:2] == name[-2:] == "__")})


# --- the post-import hook ------------------------------------------------------------------------
#
# The shape of wrapt's `importer.py` and ddtrace's `ModuleWatchdog`: a meta path finder that answers
# for a watched name by asking the finders behind it (a per-thread guard keeps it out of its own
# look-up), and chains the loader it gets, so that the callbacks run right after the module's body,
# on the importing thread. It relies on the public protocols only (PEP 451 finders and loaders,
# `sys.meta_path`, `sys.modules`); it edits nothing of the import system and drops no module.
#
# - A module already imported when it is watched fires at once, in install(); so does one loaded
#   without our loader (another finder in front of ours, an import already running at install, a
#   module that imports the shim at its top, a lazily loaded module whose body ran at its first use):
#   at the end of the process's next import, whatever it imports (`_due`, read at each import). A
#   module still running its body is not due: `__spec__._initializing`, which the import system sets
#   for every import since 3.4, is read, never written (were it gone, a module would count as
#   finished, as wrapt and ddtrace take any module in sys.modules).
# - Nothing here imports inside `find_spec`, where the import system holds its global lock; the
#   callbacks import the shim's own modules after the module's body, where no import lock but that
#   module's own is held, as the module's body itself would.
# - A callback never fails an import: its exception is recorded for status() and logged once. The
#   application's own exceptions go on: KeyboardInterrupt, SystemExit, and what its signal handler
#   raises (Ctrl-C, Ray's `cancel`, a step timeout). Raised from `exec_module`, such an exception
#   makes the import fail as it would have had it landed in the module's last line; the module is
#   imported afresh, and fires, when the application imports it again.
# - Callbacks run under `_lock`, one module at a time, and a fork waits for them (`_before_fork`):
#   a child never holds the shim's modules half loaded by a thread it does not have.
# - A callback that imports another watched module does not nest: that module is due when the
#   callback returns, and fires then (our own modules would be half built inside it).
# - The finder moves back to the front of `sys.meta_path` when it finds another in front of it
#   (pytest's assertion rewriter), so the next watched module is chained again. `sys.meta_path` is
#   replaced, never edited: another thread's import may be walking it.
# - Legacy protocols: Python 3.10 and 3.11 still ask a finder that has only `find_module` (3.12
#   dropped them), so ours asks it in its turn, as they do, and it still serves its modules. A loader
#   with only `load_module` (any Python up to 3.13 still loads with one) is not chained: its module
#   fires at the end of the next import (`_due`), as one served by a finder in front of ours does.
#   Skipping a legacy finder would hand its module to a finder behind it (another module), and
#   answering None on meeting one would leave every later import unchained where it stands in
#   front of the path finder: keeping it costs five lines, avoiding it safely more.

_local = _thread._local()  # per thread: `searching` (the names it looks up for the finder), `forking`
_fired: "dict[str, object]" = {}  # name -> the module object its callbacks ran for
_busy: "list[int]" = []  # the thread running callbacks now, under `_lock`


class _Finder:
    def find_spec(self, fullname, path=None, target=None):  # type: (str, Any, Any) -> Any
        if not _watched:
            return None
        meta_path = sys.meta_path
        if not meta_path or meta_path[0] is not self:
            _to_front()
        watched = fullname in _watched
        if not watched and not _due():
            return None
        searching = _local.__dict__.setdefault("searching", set())
        if fullname in searching:
            return None  # our own look-up below, come back: the finders behind us answer
        searching.add(fullname)
        try:
            spec = _find_behind(fullname, path, target)
        finally:
            searching.discard(fullname)
        loader = getattr(spec, "loader", None)
        if hasattr(loader, "exec_module") and type(loader) is not _Chained:  # not a legacy loader
            spec.loader = _Chained(loader, fullname if watched else None)
        return spec


def _find_behind(fullname, path, target):  # type: (str, Any, Any) -> Any
    # What the rest of the meta path answers, asked as the import system asks it.
    for finder in sys.meta_path:
        if finder is _finder:
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None:
            spec = find(fullname, path, target)
        elif sys.version_info < (3, 12) and hasattr(finder, "find_module"):  # a legacy finder, served until 3.12
            loader = finder.find_module(fullname, path)
            # importlib.util.spec_from_loader, from the bootstrap every interpreter has loaded
            spec = None if loader is None else sys.modules["_frozen_importlib"].spec_from_loader(fullname, loader)
        else:
            continue
        if spec is not None:
            return spec
    return None


class _Chained:
    # The real loader, then the callbacks of `name` (None: an import chained only to fire what is
    # due). Only a loader with `exec_module` is chained (`_Finder`); everything else of it is read
    # through.
    def __init__(self, loader, name):  # type: (Any, str | None) -> None
        self._loader, self._name = loader, name

    def __getattr__(self, name):  # type: (str) -> Any
        return getattr(self.__dict__["_loader"], name)

    def exec_module(self, module):  # type: (ModuleType) -> None
        # The real loader back before the body runs: nothing that outlives the import sees ours
        # (pkgutil, importlib.resources, a reload). A module type that refuses keeps ours: harmless.
        for owner, name in ((module, "__loader__"), (getattr(module, "__spec__", None), "loader")):
            try:
                if getattr(owner, name, None) is self:
                    setattr(owner, name, self._loader)
            except Exception:
                pass
        depth = _local.__dict__.get("depth", 0)  # chained imports running on this thread, outside in
        _local.depth = depth + 1
        try:
            self._loader.exec_module(module)
        finally:
            _local.depth = depth
        _fire(self._name, module, depth)


def _fire(name=None, module=None, nested=0):  # type: (str | None, Any, int) -> None
    # The callbacks of `name`, whose body has just run in `module`, then of every module due. What is
    # due fires only at the end of the outermost import of this thread (`nested` 0): inside another
    # module's import (a package's submodule: wrapt.wrappers inside wrapt) that module is half built,
    # and a callback importing it would get it so. An import chained only for what is due (name
    # None) never waits for another thread's firing: it may be a module that firing is importing
    # right now (wrapt, logging), and that thread takes what is due when its callback returns.
    me = _thread.get_ident()
    if me in _busy or (name is None and (_busy or nested)):
        return  # inside a callback on this thread: `name` is due when it returns
    with _lock:
        _busy.append(me)
        try:
            while True:
                if name is not None and name in _watched:
                    _on_import(name, module)
                    _fired[name] = module  # after: callbacks an interrupt cut short are due again
                due = None if nested else _due()
                if not due:
                    return
                name, module = due[0]
        finally:
            _busy.remove(me)


def _due():  # type: () -> list[tuple[str, Any]]
    # Watched modules loaded and finished whose callbacks have not run for that module object. Runs at
    # each import: the set operation is C, over the watched names. `_watched` is read once: an
    # install or uninstall on another thread replaces it meanwhile.
    found = []
    watched = _watched
    for name in watched.keys() & sys.modules.keys():
        module = sys.modules.get(name)
        if _fired.get(name) is not module and _finished(module):
            found.append((name, module))
    if len(found) > 1:  # a set has no order: WATCH's (Ray's callbacks before a table module's)
        order = list(watched)
        found.sort(key=lambda item: order.index(item[0]))
    return found


def _finished(module):  # type: (object) -> bool
    d = _module_namespace(module)
    try:
        return d is not None and not getattr(d.get("__spec__"), "_initializing", False)
    except Exception:
        return False


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


def _on_import(name, module):  # type: (str, ModuleType) -> None
    # Under `_lock`, this thread in `_busy`.
    if not _fork_hooks_after_logging:
        __import__("logging")  # the callbacks load it first anyway (`_log`)
        _register_fork_hooks()
    try:
        _resolve(_watched.get(name, _PATCH_TARGETS))(module)
    except Exception as exc:  # a hook never fails the import...
        try:
            from_signal_handler = _resolve("te_offload_shim._signals:raised_by_signal_handler")(exc)
        except Exception:  # a broken install: the callback's failure, then
            from_signal_handler = False
        if from_signal_handler:
            raise  # ...but the application's signal handler's exception is on its way to it
        why = f"{name}: {type(exc).__name__}"
        try:
            why = f"{why}: {exc}"
        except Exception:  # an exception whose __str__ raises
            pass
        if why not in _hook_errors:
            _hook_errors.append(why)  # for status()
        try:
            _resolve("te_offload_shim._log:warn_once")(f"hook:{name}", "te_offload_shim: patching failed (%s)", why)
        except Exception:  # not even logging may fail the import
            pass


def _to_front():  # type: () -> None
    sys.meta_path = [_finder, *_meta_path_without()]


def _meta_path_without():  # type: () -> list[Any]
    # A new list, not an edit of sys.meta_path: an import on another thread may be iterating it.
    return [other for other in sys.meta_path if other is not _finder]


def _before_fork():  # type: () -> None
    # A fork waits for the install, uninstall or callbacks in flight on another thread, so that the
    # child never holds them half done (the shim's modules half loaded, locked by a thread it does
    # not have). Up to 5 s: a callback stuck longer is the application's hang, not one to spread.
    # Once per fork, however many times the hooks are registered; per thread, as forks are.
    if "forking" not in _local.__dict__:
        _local.forking = _lock.acquire(timeout=5)


def _after_fork_in_parent():  # type: () -> None
    if _local.__dict__.pop("forking", False):
        _lock.release()


def _after_fork_in_child():  # type: () -> None
    global _lock
    _local.__dict__.pop("forking", None)
    _lock = _thread.RLock()  # free whatever the parent's other threads held (the wait ran out)
    _busy[:] = [t for t in _busy if t == _thread.get_ident()]


def _register_fork_hooks():  # type: () -> None
    # The hooks registered last run first at a fork, and logging's takes its module lock, which a
    # firing that loads a module calling `logging.getLogger` needs (`_log`, wrapt's asyncio): so
    # ours are registered again at the first firing, logging imported first, and run before it.
    global _fork_hooks_after_logging
    _fork_hooks_after_logging = "logging" in sys.modules
    if hasattr(os, "register_at_fork"):  # POSIX
        os.register_at_fork(
            before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
        )


# `importlib.reload(te_offload_shim)` runs this file again in the same namespace: the finder on the
# meta path is kept (no second one), and install() below patches again what is imported, which the
# engine finds already patched.
if "_finder" not in globals():  # once per process: a reload finds them registered
    _fork_hooks_after_logging = False
    _register_fork_hooks()
_finder = globals().get("_finder") or _Finder()

install()
