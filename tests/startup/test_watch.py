"""The post-import hook (te_offload_shim/_hook.py: the finder, its chained loader, the firing), in
this process.

Each test gets an import hook of its own (`ImportHook()`, installed by the `modules` fixture and
uninstalled after it, as ddtrace's `module_watchdog` fixture does), writes its own modules, under
names no other test uses, to a temporary directory, and watches them with callbacks of its own,
named `module:function` as the start-up's table names its callbacks. The package's own hook (the
shim may be installed in this process by another test) watches none of these names.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from te_offload_shim._hook import ChainedLoader, ImportHook, finished

_serial = itertools.count()
HOOKS = "watch_probe_hooks"  # the module the tests' callbacks are named in
JOIN_S = 10  # how long a test waits for a thread it started


class Modules:
    """Module files in one directory on sys.path, named `<prefix>_<name>`, and the test's own hook."""

    def __init__(self, directory: Path, hook: ImportHook) -> None:
        self.directory = directory
        self.prefix = f"watch_probe_{next(_serial)}"
        self.hook = hook

    def write(self, name: str, source: str) -> str:
        full = f"{self.prefix}_{name}"
        (self.directory / f"{full}.py").write_text(source)
        importlib.invalidate_caches()
        return full

    def watch(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        """Watch one more module: the hook installed again with the larger table (what is due fires
        then, as at install)."""
        setattr(sys.modules[HOOKS], f"on_{name}", callback)
        table = {**self.hook.watched, name: f"{HOOKS}:on_{name}"}
        self.hook.uninstall(lambda: 0)
        self.hook.install(table)


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Modules]:
    hook = ImportHook()
    sys.modules[HOOKS] = ModuleType(HOOKS)
    sys.path.insert(0, str(tmp_path))
    made = Modules(tmp_path, hook)
    hook.install({})
    try:
        yield made
    finally:
        hook.uninstall(lambda: 0)
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith(made.prefix) or n == HOOKS]:
            del sys.modules[name]
        importlib.invalidate_caches()


def _joined(thread: threading.Thread) -> bool:
    thread.join(JOIN_S)
    return not thread.is_alive()


@contextlib.contextmanager
def behind_ours(hook: ImportHook, finder: object) -> Iterator[None]:
    """`finder` on the meta path right behind `hook` (the package's own hook may stand first), and off
    it again after."""
    at = sys.meta_path.index(hook) + 1
    sys.meta_path = [*sys.meta_path[:at], finder, *sys.meta_path[at:]]  # type: ignore[list-item]
    try:
        yield
    finally:
        sys.meta_path = [f for f in sys.meta_path if f is not finder]


def interrupted_the_first_time(calls: list) -> Callable[[ModuleType], None]:
    """A callback that raises KeyboardInterrupt (Ctrl-C, Ray's cancel) the first time, then records
    the module."""

    def interrupted_once(module: ModuleType) -> None:
        if not calls:
            calls.append("interrupted")
            raise KeyboardInterrupt
        calls.append(module)

    return interrupted_once


def recorder(calls: list) -> Callable[[ModuleType], None]:
    """A callback that records the module and what its body had defined by then."""

    def callback(module: ModuleType) -> None:
        calls.append((module, getattr(module, "DONE", None)))

    return callback


def test_fires_after_the_module_body_once_with_the_real_loader_back(modules: Modules) -> None:
    name = modules.write("plain", "DONE = 'body ran to its end'\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    assert sys.meta_path[0] is modules.hook
    assert calls == [], "watching a module not imported yet runs nothing"

    module = importlib.import_module(name)
    assert calls == [(module, "body ran to its end")]
    # our loader is gone from everything that outlives the import
    assert type(module.__loader__) is importlib.machinery.SourceFileLoader
    assert module.__spec__ is not None and type(module.__spec__.loader) is importlib.machinery.SourceFileLoader
    assert type(module.__spec__) is importlib.machinery.ModuleSpec

    importlib.import_module(name)  # already imported: no new import, no new call
    importlib.import_module(modules.write("later", ""))  # a later import fires nothing more
    assert len(calls) == 1, "the callbacks run once per module object"


def test_watching_an_imported_module_fires_at_once(modules: Modules) -> None:
    name = modules.write("early", "DONE = True\n")
    module = importlib.import_module(name)
    calls: list = []
    modules.watch(name, recorder(calls))
    assert calls == [(module, True)]
    importlib.import_module(modules.write("later", ""))
    assert len(calls) == 1


def test_the_finder_answers_only_for_watched_names(modules: Modules) -> None:
    watched = modules.write("watched", "DONE = 1\n")
    other = modules.write("other", "DONE = 1\n")
    modules.watch(watched, recorder([]))
    spec = modules.hook.find_spec(watched)
    assert spec is not None and type(spec.loader) is ChainedLoader
    assert modules.hook.find_spec(other) is None
    assert modules.hook.find_spec(f"{modules.prefix}_nowhere") is None, "a watched name nobody can find"


def test_the_finder_imports_nothing() -> None:
    """`find_spec` runs under the import system's global lock: it loads no module of any kind."""
    import te_offload_shim

    hook = te_offload_shim.HOOK
    assert hook.installed and "verl.utils.megatron_utils" in hook.watched
    before = set(sys.modules)
    for name in ("json", "verl.utils.megatron_utils", "a_module_nobody_has"):
        hook.find_spec(name)
    assert set(sys.modules) == before


def test_a_new_module_object_fires_again_and_reload_fires_again(modules: Modules) -> None:
    name = modules.write("again", "DONE = object()\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    first = importlib.import_module(name)
    del sys.modules[name]
    second = importlib.import_module(name)
    assert second is not first
    assert [c[0] for c in calls] == [first, second]
    importlib.reload(second)
    assert [c[0] for c in calls] == [first, second, second], "the finder stays on the meta path for a reload"


def test_uninstall_takes_the_finder_off_and_stops_firing(modules: Modules) -> None:
    name = modules.write("dropped", "DONE = 1\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    assert modules.hook.uninstall(lambda: 0) == 0
    assert modules.hook not in sys.meta_path
    importlib.import_module(name)
    importlib.import_module(modules.write("later", ""))
    assert calls == []


def _load_behind_its_back(modules: Modules, name: str) -> ModuleType:
    """Load `name` as another finder put in front of ours would: plainly, without our finder."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(modules.directory)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_a_module_loaded_without_the_finder_fires_at_the_end_of_the_next_import(modules: Modules) -> None:
    name = modules.write("unseen", "DONE = 'loaded behind our back'\n")
    trigger = modules.write("trigger", "import sys\nSEEN_BEFORE_MY_END = len(sys.modules['watch_probe_hooks'].calls)\n")
    calls: list = []
    sys.modules[HOOKS].calls = calls  # type: ignore[attr-defined]
    modules.watch(name, recorder(calls))
    module = _load_behind_its_back(modules, name)
    assert calls == []
    triggered = importlib.import_module(trigger)  # any import: the finder chains it, and fires what is due
    assert calls == [(module, "loaded behind our back")] and triggered.SEEN_BEFORE_MY_END == 0
    importlib.import_module(modules.write("later", ""))
    assert len(calls) == 1


def test_an_import_in_flight_fires_at_the_next_import_after_it_finishes(modules: Modules) -> None:
    """The watch begins while the module's body runs (the module that imports the shim): it is not
    fired half built, and its spec is left as the import system made it."""
    calls: list = []
    sys.modules[HOOKS].calls = calls  # type: ignore[attr-defined]
    sys.modules[HOOKS].watch = modules.watch  # type: ignore[attr-defined]
    sys.modules[HOOKS].recorder = recorder  # type: ignore[attr-defined]
    name = modules.write(
        "inflight",
        "import sys\n"
        "hooks = sys.modules['watch_probe_hooks']\n"
        "hooks.watch(__name__, hooks.recorder(hooks.calls))\n"
        "import json.decoder  # an import inside the body: this module is not finished yet\n"
        "FIRED_EARLY = bool(hooks.calls)\n"
        "DONE = 'end of body'\n",
    )
    module = importlib.import_module(name)
    assert not module.FIRED_EARLY and calls == []
    importlib.import_module(modules.write("next", ""))
    assert calls == [(module, "end of body")]
    assert type(module.__spec__) is importlib.machinery.ModuleSpec


def test_a_failed_import_in_flight_fires_nothing(modules: Modules) -> None:
    calls: list = []
    sys.modules[HOOKS].watch = modules.watch  # type: ignore[attr-defined]
    sys.modules[HOOKS].callback = recorder(calls)  # type: ignore[attr-defined]
    name = modules.write(
        "fails",
        "import sys\n"
        "hooks = sys.modules['watch_probe_hooks']\n"
        "hooks.watch(__name__, hooks.callback)\n"
        "raise RuntimeError('the body fails')\n",
    )
    with pytest.raises(RuntimeError, match="the body fails"):
        importlib.import_module(name)
    importlib.import_module(modules.write("next", ""))
    assert calls == [] and name not in sys.modules


def test_a_callback_error_is_recorded_and_not_raised_into_the_import(modules: Modules) -> None:
    name = modules.write("erring", "DONE = 1\n")
    later = modules.write("also_due", "DONE = 2\n")
    calls: list = []

    def boom(module: ModuleType) -> None:
        raise ValueError("callback failed")

    modules.watch(name, boom)
    modules.watch(later, recorder(calls))
    module = importlib.import_module(name)  # must not raise
    assert module.DONE == 1
    assert modules.hook.errors[name] == "ValueError: callback failed"
    assert importlib.import_module(later).DONE == 2 and len(calls) == 1, "the other modules still fire"


def test_a_callback_error_is_logged_once_per_module_with_its_reason(
    modules: Modules, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's one line per module whose callback failed: which module, and why; a module
    imported again (a new module object) whose callback fails again is not said twice."""
    names = [modules.write(n, "DONE = 1\n") for n in ("fails_a", "fails_b")]

    def boom(module: ModuleType) -> None:
        raise ValueError("callback failed")

    for name in names:
        modules.watch(name, boom)
    with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
        for name in names:
            importlib.import_module(name)
        del sys.modules[names[0]]
        importlib.import_module(names[0])
    said = [r.getMessage().removeprefix("te_offload_shim: ") for r in caplog.records if r.name == "te_offload_shim"]
    assert said == [f"patching failed ({name}: ValueError: callback failed)" for name in names]


def test_a_callback_error_is_not_raised_even_where_the_shims_own_modules_cannot_load(
    modules: Modules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken install (the shim's signal-handler check cannot be imported, so neither can its
    logging): the callback's failure is still recorded, by its type's name (nothing can describe it
    further), and kept out of the application's import."""
    name = modules.write("fails_broken", "DONE = 1\n")

    def boom(module: ModuleType) -> None:
        raise ValueError("callback failed")

    modules.watch(name, boom)
    monkeypatch.delitem(sys.modules, "te_offload_shim._log", raising=False)  # not loaded yet, whatever ran before
    monkeypatch.setitem(sys.modules, "te_offload_shim._signals", None)  # its import fails
    assert importlib.import_module(name).DONE == 1
    assert modules.hook.errors[name] == "ValueError"


def test_a_callback_error_fails_no_import_in_strict_mode(modules: Modules, monkeypatch: pytest.MonkeyPatch) -> None:
    """`TE_OFFLOAD_SHIM_STRICT=1` raises the shim's own errors for tests, but not into an import:
    a failing callback is recorded, and the application's import goes on."""
    monkeypatch.setenv("TE_OFFLOAD_SHIM_STRICT", "1")
    name = modules.write("fails_strict", "DONE = 1\n")

    def boom(module: ModuleType) -> None:
        raise ValueError("callback failed")

    modules.watch(name, boom)
    assert importlib.import_module(name).DONE == 1
    assert modules.hook.errors[name] == "ValueError: callback failed"


def test_the_applications_interrupt_in_a_callback_reaches_it_and_the_next_import_fires(modules: Modules) -> None:
    """KeyboardInterrupt (Ctrl-C, Ray's cancel) during a callback fails the import, as it would have
    in the module's last line; importing it again runs the body and the callbacks afresh."""
    name = modules.write(
        "interrupted", "import builtins\nbuiltins.INTERRUPTED_RUNS = getattr(builtins, 'INTERRUPTED_RUNS', 0) + 1\n"
    )
    calls: list = []
    interrupted_once = interrupted_the_first_time(calls)
    modules.watch(name, interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        importlib.import_module(name)
    assert name not in sys.modules
    module = importlib.import_module(name)
    import builtins

    assert calls == ["interrupted", module] and builtins.INTERRUPTED_RUNS == 2  # type: ignore[attr-defined]
    del builtins.INTERRUPTED_RUNS  # type: ignore[attr-defined]


def test_modules_due_at_once_fire_in_the_watch_tables_order(modules: Modules) -> None:
    """What is due at install fires in the table's order, not the order sys.modules or a set gives
    (Ray's callbacks must run before a table module's)."""
    names = [modules.write(n, "DONE = 1\n") for n in ("b_second", "a_first", "c_third")]
    for name in names:
        importlib.import_module(name)
    order: list[str] = []
    for name in names:
        setattr(sys.modules[HOOKS], f"on_{name}", lambda module, name=name: order.append(name))
    table = {name: f"{HOOKS}:on_{name}" for name in (names[1], names[2], names[0])}
    modules.hook.uninstall(lambda: 0)
    modules.hook.install(table)
    assert order == list(table)


def test_two_modules_due_at_once_fire_in_the_watch_tables_order_whatever_the_hash_seed(modules: Modules) -> None:
    """Two, not three: the hook finds what is due through a set, whose order comes from the hash seed;
    the pair is chosen so that this interpreter's set order is not the table's (one pair in two is)."""
    for attempt in range(40):
        table: dict[str, str] = {}
        for n in ("x", "y"):
            name = modules.write(f"due_pair_{attempt}_{n}", "DONE = 1\n")
            importlib.import_module(name)
            table[name] = f"{HOOKS}:on_{name}"
        if list(dict(table).keys() & sys.modules.keys()) != list(table):  # as the hook finds them
            break
    else:
        pytest.fail("no pair of names whose set order differs from the table's in 40")
    order: list[str] = []
    for name in table:
        setattr(sys.modules[HOOKS], f"on_{name}", lambda module, name=name: order.append(name))
    modules.hook.uninstall(lambda: 0)
    modules.hook.install(table)
    assert order == list(table)


def test_what_is_due_is_read_from_one_watch_table_while_another_thread_replaces_it(modules: Modules) -> None:
    """An uninstall on another thread replaces the watch table while what is due is read (here:
    while the first module's `__spec__` is read): the order still comes from the table they were
    found in; a second read found none of them and raised (ValueError) out of the finder, into the
    application's import."""
    hook = modules.hook

    class Spec:
        @property
        def _initializing(self) -> bool:
            hook.uninstall(lambda: 0)  # what an uninstall on another thread does meanwhile
            return False

    names = [modules.write(n, "") for n in ("second", "first")]
    for name in names:
        module = ModuleType(name)
        module.__spec__ = Spec()  # type: ignore[assignment]
        sys.modules[name] = module
    fired: list[str] = []
    sys.modules[HOOKS].on_first = sys.modules[HOOKS].on_second = fired.append  # type: ignore[attr-defined]
    hook.uninstall(lambda: 0)
    hook.install({names[1]: f"{HOOKS}:on_first", names[0]: f"{HOOKS}:on_second"})  # must not raise
    hook.install({})
    importlib.import_module(modules.write("later", ""))  # nor any import after it
    assert fired == [] and hook.installed


def test_a_callback_that_imports_a_watched_module_does_not_nest(modules: Modules) -> None:
    """A callback importing another watched module (the patcher loads wrapt) must not have that
    module's callbacks run inside it: they run right after it returns."""
    inner = modules.write("inner", "DONE = 'inner'\n")
    outer = modules.write("outer", "DONE = 'outer'\n")
    order: list[str] = []

    def on_outer(module: ModuleType) -> None:
        order.append("outer start")
        importlib.import_module(inner)
        order.append("outer end")

    def on_inner(module: ModuleType) -> None:
        order.append(f"inner saw {module.DONE}")

    modules.watch(outer, on_outer)
    modules.watch(inner, on_inner)
    importlib.import_module(outer)
    assert order == ["outer start", "outer end", "inner saw inner"]
    importlib.import_module(modules.write("later", ""))
    assert len(order) == 3, "and only once"


def test_a_hook_reads_as_uninstalled_until_it_installs_and_installs_once() -> None:
    """What the rest of the package reads of the hook (`installed`, the watch table, the user's
    targets and problems, the callbacks' errors), before, during and after an install; `install`
    says whether it installed, `uninstall` hands on what `restore` returned."""
    hook = ImportHook()
    assert (hook.installed, hook.watched, hook.user_targets, hook.problems, hook.errors) == (False, {}, (), [], {})
    assert hook.installed is False and hook not in sys.meta_path
    try:
        assert hook.install({}, user_targets=["a target"], problems=["a problem"]) is True
        assert hook.installed is True and sys.meta_path[0] is hook
        assert (hook.user_targets, hook.problems) == (("a target",), ["a problem"])
        assert hook.install({"json": "json:dumps"}) is False, "installed already: nothing changes"
        assert hook.watched == {}
    finally:
        assert hook.uninstall(lambda: 7) == 7
    assert hook.installed is False and hook not in sys.meta_path


class FrontFinder:
    """A finder that goes in front of ours and serves one module, as pytest's assertion rewriter does
    for the modules it rewrites."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.directory)])


def test_a_finder_put_in_front_is_passed_again_at_the_next_look_up(modules: Modules) -> None:
    """A finder that went in front of ours and serves a watched module: at the next look-up ours
    is first again, and chains that finder's loader: the callback runs at the end of the module's
    own import, not at some later one."""
    name = modules.write("served_in_front", "DONE = 'served'\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    front = FrontFinder(name, modules.directory)
    sys.meta_path = [front, *sys.meta_path]
    try:
        importlib.import_module(modules.write("any_other", ""))  # any look-up that reaches ours
        module = importlib.import_module(name)
        assert calls == [(module, "served")]
    finally:
        sys.meta_path = [finder for finder in sys.meta_path if finder is not front]


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM": "0"})  # the package's own hook not installed: ours alone
def test_imports_leave_the_meta_path_list_as_it_is_while_ours_is_first(modules: Modules) -> None:
    """Ours first already: an import, watched or not, leaves `sys.meta_path` the very list it was.
    A new list at every import would cost each import a copy, and lose a finder another thread
    adds to the list meanwhile."""
    name = modules.write("kept_list", "DONE = 1\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    meta_path = sys.meta_path
    assert meta_path[0] is modules.hook
    importlib.import_module(name)
    importlib.import_module(modules.write("unwatched", ""))
    assert sys.meta_path is meta_path and len(calls) == 1


def test_what_is_due_fires_at_the_end_of_each_later_import_on_the_thread(modules: Modules) -> None:
    """After chained imports have ended on this thread (one watched, one fired because something was
    due), a module loaded without our finder still fires at the end of the next import: an import
    that ended is not counted as still running."""
    watched = modules.write("first_watched", "DONE = 1\n")
    unseen = modules.write("unseen_later", "DONE = 'loaded behind our back'\n")
    other = modules.write("other_unseen", "DONE = 'also behind our back'\n")
    calls: list = []
    modules.watch(watched, recorder(calls))
    modules.watch(unseen, recorder(calls))
    modules.watch(other, recorder(calls))
    first = importlib.import_module(watched)
    module = _load_behind_its_back(modules, unseen)
    importlib.import_module(modules.write("trigger_one", ""))
    later = _load_behind_its_back(modules, other)
    importlib.import_module(modules.write("trigger_two", ""))
    assert calls == [(first, 1), (module, "loaded behind our back"), (later, "also behind our back")]


def test_a_package_body_s_watched_imports_fire_at_their_end_and_what_is_due_at_the_package_s_end(
    modules: Modules,
) -> None:
    """A watched module imported inside another's body fires at the end of its own import; what is
    due (a module loaded without our finder) waits for the end of the outermost import, where no
    module of the thread is half built."""
    unseen = modules.write("due_meanwhile", "DONE = 'due'\n")
    parts = [modules.write(n, "DONE = 1\n") for n in ("part_one", "part_two")]
    package = modules.write("package", f"import {parts[0]}\nimport {parts[1]}\nDONE = 'whole'\n")
    events: list[str] = []
    for name in (*parts, package, unseen):
        modules.watch(name, lambda module: events.append(module.__name__[len(modules.prefix) + 1 :]))
    _load_behind_its_back(modules, unseen)
    importlib.import_module(package)
    assert events == ["part_one", "part_two", "package", "due_meanwhile"]


def test_a_callback_an_interrupt_cut_short_is_due_again_at_the_next_import(modules: Modules) -> None:
    """KeyboardInterrupt in the callback of a module imported before the watch (here: while the
    install fires it): the module stays imported, unpatched, and its callback runs again at the
    next import, as if it had never started."""
    name = modules.write("cut_short", "DONE = 1\n")
    module = importlib.import_module(name)
    calls: list = []
    interrupted_once = interrupted_the_first_time(calls)
    with pytest.raises(KeyboardInterrupt):
        modules.watch(name, interrupted_once)
    assert calls == ["interrupted"] and modules.hook.installed
    importlib.import_module(modules.write("next", ""))
    assert calls == ["interrupted", module]
    importlib.import_module(modules.write("after", ""))
    assert len(calls) == 2, "and then once only"


def test_an_import_chained_for_what_is_due_leaves_it_to_the_thread_running_callbacks(modules: Modules) -> None:
    """While a thread runs a callback, an import on another thread that finds something due does not
    fire it: the thread running callbacks does, once its callback returned (it may be importing a
    module the other callback needs)."""
    busy = modules.write("busy", "DONE = 1\n")
    unseen = modules.write("unseen_while_busy", "DONE = 2\n")
    entered, release = threading.Event(), threading.Event()
    ran_on: dict[str, str] = {}

    def on_busy(module: ModuleType) -> None:
        entered.set()
        release.wait(JOIN_S)
        ran_on["busy"] = threading.current_thread().name

    modules.watch(busy, on_busy)

    def on_unseen(module: ModuleType) -> None:
        ran_on["unseen"] = threading.current_thread().name

    modules.watch(unseen, on_unseen)
    firing = threading.Thread(target=importlib.import_module, args=(busy,), name="firing", daemon=True)
    firing.start()
    try:
        assert entered.wait(JOIN_S)
        _load_behind_its_back(modules, unseen)
        importlib.import_module(modules.write("trigger", ""))
        assert ran_on == {}, "fired by the thread that is running a callback, not here"
    finally:
        release.set()
    assert _joined(firing)
    assert ran_on == {"busy": "firing", "unseen": "firing"}


def test_a_lazily_loaded_module_fires_once_its_body_ran_and_not_before(modules: Modules) -> None:
    """A watched module loaded through `importlib.util.LazyLoader` (the standard library's recipe):
    the next import finds it in sys.modules with no body run; firing then would run it, an import
    the application put off. Its first attribute read runs the body through our loader, and fires."""
    name = modules.write("lazy", "DONE = 'body ran'\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    importlib.import_module(modules.write("trigger", ""))
    assert calls == [], "fired before its body ran"
    assert module.DONE == "body ran"
    assert calls == [(module, "body ran")]


def test_a_module_whose_spec_still_names_the_lazy_loader_has_not_finished(modules: Modules) -> None:
    """Python 3.12+'s LazyLoader puts the module in sys.modules and imports `threading` before it
    makes the module lazy: meanwhile the spec still names the LazyLoader, and nothing of the body
    has run. That state, made here by hand on any Python, is not finished; once the spec names the
    real loader, it is."""
    name = modules.write("lazy_window", "DONE = 1\n")
    spec = importlib.machinery.PathFinder.find_spec(name, [str(modules.directory)])
    assert spec is not None and spec.loader is not None
    real = spec.loader
    spec.loader = importlib.util.LazyLoader(real)
    module = importlib.util.module_from_spec(spec)
    assert not finished(module)
    spec.loader = real
    assert finished(module)


def test_a_finished_module_is_told_without_importlib_util_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -S` never loads importlib.util (site does): no lazy loader can be at work then, and a
    module whose body ran is finished."""
    monkeypatch.delitem(sys.modules, "importlib.util")
    assert finished(json) and not finished(object())


def test_a_watched_submodule_fires_at_the_end_of_its_own_import(modules: Modules) -> None:
    """A module inside a package is found on the package's path, which ours hands on to the finders
    behind it."""
    package = f"{modules.prefix}_pkg"
    (modules.directory / package).mkdir()
    (modules.directory / package / "__init__.py").write_text("")
    (modules.directory / package / "inner.py").write_text("DONE = 'inner'\n")
    importlib.invalidate_caches()
    calls: list = []
    modules.watch(f"{package}.inner", recorder(calls))
    module = importlib.import_module(f"{package}.inner")
    assert calls == [(module, "inner")]


class NoSpecModule(ModuleType):
    """A module type that keeps no `__spec__` (the import system's assignment is refused)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "__spec__":
            raise AttributeError("no __spec__ in this module type")
        super().__setattr__(name, value)


class NoSpecFinder:
    """Serves one module, made by a loader whose modules keep no `__spec__`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname == self.name else None  # type: ignore[arg-type]

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = NoSpecModule(spec.name)
        del module.__dict__["__spec__"]  # ModuleType's own __init__ set it to None
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.DONE = "no spec"  # type: ignore[attr-defined]


def test_a_module_made_by_hand_and_put_in_sys_modules_fires_when_watched(modules: Modules) -> None:
    """A module no loader made (`types.ModuleType`, put in sys.modules by hand: its `__spec__` is
    None) has nothing left to run: it is finished, and fires at the watch."""
    name = f"{modules.prefix}_by_hand"
    module = ModuleType(name)
    module.DONE = "by hand"  # type: ignore[attr-defined]
    sys.modules[name] = module
    calls: list = []
    modules.watch(name, recorder(calls))
    assert calls == [(module, "by hand")]


def test_a_module_that_keeps_no_spec_is_imported_and_fired(modules: Modules) -> None:
    """A loader whose module type refuses `__spec__`: the import works as without us, and fires."""
    name = f"{modules.prefix}_no_spec"
    finder = NoSpecFinder(name)
    calls: list = []
    modules.watch(name, recorder(calls))
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(name)
    assert "__spec__" not in vars(module) and calls == [(module, "no spec")]


class RecordingFinder:
    """Serves one module from a directory, and records the `target` each look-up was given."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory
        self.targets: list[object] = []

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        self.targets.append(target)
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.directory)])


def test_a_reload_hands_its_module_to_the_finders_behind_ours(modules: Modules) -> None:
    """`importlib.reload` asks the finders with the module being reloaded as `target` (a finder may
    answer for it differently): ours hands it on, as the import system would have."""
    name = modules.write("reloaded", "DONE = 'reloaded'\n")
    finder = RecordingFinder(name, modules.directory)
    calls: list = []
    modules.watch(name, recorder(calls))
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(name)
        importlib.reload(module)
    assert finder.targets == [None, module] and calls == [(module, "reloaded")] * 2


class PassingLoader:
    """A loader around another, as wrapt's finder puts around the loader it is given."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)


class LooksUpAnotherFirst:
    """A finder behind ours that, asked for `name`, looks up `other`, then `name` again through the
    import system (guarded against itself, as wrapt's finder is), and answers with a loader of its
    own around what it got."""

    def __init__(self, name: str, other: str) -> None:
        self.name, self.other = name, other
        self.searching = False
        self.other_spec: ModuleSpec | None = None

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != self.name or self.searching:
            return None
        self.searching = True
        try:
            self.other_spec = importlib.util.find_spec(self.other)
            spec = importlib.util.find_spec(self.name)
        finally:
            self.searching = False
        assert spec is not None
        spec.loader = PassingLoader(spec.loader)  # type: ignore[assignment]
        return spec


def test_a_finder_behind_ours_that_looks_up_two_names_finds_and_fires_once(modules: Modules) -> None:
    """Ours looking up `first` asks that finder, which looks up `second` (ours answers it) and then
    `first` again: that look-up comes back to ours, which leaves it to the finders behind it, as any
    look-up of its own; had ours answered it, the finder's loader would hold ours, and ours would
    chain that again: the callback would run twice."""
    first = modules.write("looked_up_twice", "DONE = 'first'\n")
    second = modules.write("looked_up_between", "DONE = 'second'\n")
    finder = LooksUpAnotherFirst(first, second)
    calls: list = []
    modules.watch(first, recorder(calls))
    modules.watch(second, recorder([]))
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(first)
    assert calls == [(module, "first")]
    # only a look-up of the same name comes back: ours answered the other one, chained
    assert finder.other_spec is not None and type(finder.other_spec.loader) is ChainedLoader


def test_a_finder_behind_ours_that_can_find_nothing_is_passed_over(modules: Modules) -> None:
    """An entry on the meta path with neither `find_spec` nor `find_module` (the import system passes
    over it): ours asks the finders after it, and the module fires at the end of its own import."""
    name = modules.write("behind_a_blank", "DONE = 'found'\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    with behind_ours(modules.hook, object()):
        module = importlib.import_module(name)
        assert calls == [(module, "found")]


class LegacySubmoduleFinder:
    """A finder of before Python 3.4 (only `find_module`) that serves one submodule from memory, and
    only when asked with its package's path, as a path-based finder is."""

    def __init__(self, name: str, package_path: list[str]) -> None:
        self.name, self.package_path = name, package_path

    def find_module(self, fullname: str, path: Sequence[str] | None = None) -> LegacySubmoduleFinder | None:
        return self if fullname == self.name and list(path or ()) == self.package_path else None

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.DONE = "legacy"  # type: ignore[attr-defined]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 dropped find_module finders")
def test_a_submodule_a_legacy_finder_serves_fires_at_the_end_of_its_own_import(modules: Modules) -> None:
    """Ours asks a legacy finder behind it with the package's path, as the import system would: it
    serves the submodule, chained."""
    package = f"{modules.prefix}_legacy_pkg"
    (modules.directory / package).mkdir()
    (modules.directory / package / "__init__.py").write_text("")
    importlib.invalidate_caches()
    name = f"{package}.inner"
    finder = LegacySubmoduleFinder(name, [str(modules.directory / package)])
    calls: list = []
    modules.watch(name, recorder(calls))
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(name)
    assert calls == [(module, "legacy")]


class CachingFinder:
    """A finder behind ours that answers with a spec it keeps, got from the import system earlier
    (so with our loader in it), as finders that cache their look-ups do."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.spec = importlib.util.find_spec(name)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return self.spec if fullname == self.name else None


def test_a_spec_that_already_holds_our_loader_is_not_chained_again(modules: Modules) -> None:
    """A finder behind ours hands back a spec ours chained before: ours leaves it as it is, and the
    callback runs once."""
    name = modules.write("cached_spec", "DONE = 'cached'\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    finder = CachingFinder(name)
    assert finder.spec is not None and type(finder.spec.loader) is ChainedLoader
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(name)
    assert calls == [(module, "cached")]


def test_a_watched_import_warns_nothing(modules: Modules) -> None:
    """Ours asks each finder behind it as the import system does, through `find_spec`: the legacy
    `find_module` of today's finders warns (DeprecationWarning), and under `-W error` that fails the
    application's import."""
    name = modules.write("quiet", "DONE = 1\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module(name)
    assert calls == [(module, 1)]


def test_a_module_whose_spec_cannot_be_read_is_not_fired(modules: Modules) -> None:
    """A watched module whose `__spec__` raises when read (a half-made module of some framework's):
    the hook cannot tell whether its body ran, so it leaves it alone, and the import goes on."""

    class Spec:
        @property
        def _initializing(self) -> bool:
            raise RuntimeError("not readable")

    name = modules.write("unreadable", "")
    module = ModuleType(name)
    module.__spec__ = Spec()  # type: ignore[assignment]
    sys.modules[name] = module
    calls: list = []
    modules.watch(name, recorder(calls))
    importlib.import_module(modules.write("trigger", ""))
    assert calls == []


def test_a_watched_import_on_another_thread_fires_there_while_this_thread_runs_a_callback(modules: Modules) -> None:
    """A callback starts a thread that imports another watched module, and waits for it: that
    module's callback runs on that thread, at the end of its import, not later on this one."""
    first = modules.write("first_busy", "DONE = 1\n")
    second = modules.write("second_elsewhere", "DONE = 2\n")
    events: list = []

    def import_second() -> None:
        importlib.import_module(second)
        events.append("second imported")

    def on_first(module: ModuleType) -> None:
        events.append("first")
        thread = threading.Thread(target=import_second, name="other", daemon=True)
        thread.start()
        events.append(_joined(thread))

    modules.watch(first, on_first)
    modules.watch(second, lambda module: events.append(f"second on {threading.current_thread().name}"))
    importlib.import_module(first)
    assert events == ["first", "second on other", "second imported", True]


def test_a_module_imported_again_while_its_old_callback_runs_fires_for_each_and_fails_no_import(
    modules: Modules,
) -> None:
    """Thread `firing` runs the callback of a module loaded without our finder; meanwhile this thread
    imports the module afresh (a new module object): its callback runs here at once, and the first
    one's end, after it, fails nothing."""
    name = modules.write("again_meanwhile", "DONE = 1\n")
    entered, release = threading.Event(), threading.Event()
    calls: list = []

    def callback(module: ModuleType) -> None:
        calls.append(module)
        if len(calls) == 1:
            entered.set()
            release.wait(JOIN_S)

    modules.watch(name, callback)
    first = _load_behind_its_back(modules, name)
    failed: list[BaseException] = []

    def trigger() -> None:
        try:
            importlib.import_module(modules.write("trigger", ""))
        except BaseException as exc:
            failed.append(exc)

    firing = threading.Thread(target=trigger, name="firing", daemon=True)
    firing.start()
    try:
        assert entered.wait(JOIN_S)
        del sys.modules[name]
        second = importlib.import_module(name)
        assert calls == [first, second]
    finally:
        release.set()
    assert _joined(firing) and failed == []
    importlib.import_module(modules.write("later", ""))
    assert calls == [first, second]


def test_a_module_reloaded_while_its_callback_runs_elsewhere_fires_again_after_it(modules: Modules) -> None:
    """Thread `firing` runs the callback of a module loaded without our finder; meanwhile this thread
    reloads the module (its body runs again, new functions in it). The callback is not run twice at
    once: it runs again once the first one returned, on the new functions."""
    name = modules.write("reloaded_meanwhile", "def offload():\n    pass\n")
    entered, release = threading.Event(), threading.Event()
    seen: list = []

    def callback(module: ModuleType) -> None:
        seen.append(module.offload)
        if len(seen) == 1:
            entered.set()
            release.wait(JOIN_S)

    modules.watch(name, callback)
    module = _load_behind_its_back(modules, name)
    firing = threading.Thread(target=importlib.import_module, args=(modules.write("trigger", ""),), daemon=True)
    firing.start()
    try:
        assert entered.wait(JOIN_S)
        importlib.reload(module)
        assert len(seen) == 1, "run a second time while the first still ran"
    finally:
        release.set()
    assert _joined(firing)
    importlib.import_module(modules.write("later", ""))
    assert len(seen) == 2 and seen[-1] is module.offload


def test_a_watched_import_ends_while_another_thread_still_runs_a_callback(modules: Modules) -> None:
    """Thread `firing` runs the callback of a module loaded without our finder, and waits; a watched
    import here fires its own callback and returns at once, without waiting for (or retrying) the
    module whose callback is still running there."""
    slow = modules.write("slow_callback", "DONE = 1\n")
    quick = modules.write("quick_import", "DONE = 2\n")
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def on_slow(module: ModuleType) -> None:
        entered.set()
        calls.append("slow released" if release.wait(JOIN_S) else "slow timed out")

    modules.watch(slow, on_slow)
    modules.watch(quick, lambda module: calls.append("quick"))
    _load_behind_its_back(modules, slow)
    firing = threading.Thread(target=importlib.import_module, args=(modules.write("trigger", ""),), daemon=True)
    firing.start()
    try:
        assert entered.wait(JOIN_S)
        importlib.import_module(quick)
        assert calls == ["quick"], "the import waited for the other thread's callback"
    finally:
        release.set()
    assert _joined(firing) and calls == ["quick", "slow released"]


# --- threads: callbacks run outside the hook's lock (wrapt's import-deadlock tests, in our terms).
# Each runs in a child interpreter of its own: on a deadlock its daemon threads stay stuck there.


@pytest.mark.subprocess()
@pytest.mark.parametrize("imported", ["before", "after"])
def test_a_callback_whose_thread_watches_again_does_not_deadlock(modules: Modules, imported: str) -> None:
    """wrapt's `test_import_deadlock_1` and `_2`: a callback (for a module imported before the watch,
    or after it) starts a thread that installs the hook again, and waits for it. Under the hook's
    lock the thread waited for the callback, which waited for the thread."""
    name = modules.write("starts_a_thread", "DONE = 1\n")
    other = modules.write("watched_by_the_thread", "DONE = 1\n")
    done: list[bool] = []

    def callback(module: ModuleType) -> None:
        thread = threading.Thread(target=modules.watch, args=(other, recorder([])), daemon=True)
        thread.start()
        done.append(_joined(thread))

    if imported == "before":
        importlib.import_module(name)
    modules.watch(name, callback)
    importlib.import_module(name)
    assert done == [True]


@pytest.mark.subprocess()
def test_a_callback_whose_thread_imports_a_watched_module_does_not_deadlock(modules: Modules) -> None:
    """wrapt's `test_import_deadlock_3`: a callback starts a thread that imports another watched
    module, and waits for it: that module's callback runs on that thread, while the first one waits."""
    first = modules.write("first", "DONE = 1\n")
    second = modules.write("second", "DONE = 2\n")
    order: list[str] = []
    done: list[bool] = []

    def on_first(module: ModuleType) -> None:
        order.append("first")
        thread = threading.Thread(target=importlib.import_module, args=(second,), daemon=True)
        thread.start()
        done.append(_joined(thread))

    modules.watch(first, on_first)
    modules.watch(second, lambda module: order.append("second"))
    importlib.import_module(first)
    assert done == [True] and order == ["first", "second"]


@pytest.mark.subprocess()
def test_two_threads_whose_imports_cross_through_a_callback_both_finish(modules: Modules) -> None:
    """Thread 1 imports `one`, whose body imports watched `w1`; w1's callback imports `two`, which
    thread 2 is importing: its body waits until that callback started, then imports watched `w2`.
    Under the hook's lock thread 2 waited for thread 1's callback, which waited for `two`'s import
    lock, held by thread 2: neither ever finished. Each callback runs once."""
    hooks = sys.modules[HOOKS]
    hooks.two_started, hooks.w1_called = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    w1 = modules.write("w1", "DONE = 1\n")
    w2 = modules.write("w2", "DONE = 2\n")
    one = modules.write("one", f"import {w1}\n")
    two = modules.write(
        "two",
        f"import sys\nhooks = sys.modules['{HOOKS}']\nhooks.two_started.set()\n"
        f"assert hooks.w1_called.wait({JOIN_S})\nimport {w2}\nDONE = 'two'\n",
    )
    calls: list[str] = []

    def on_w1(module: ModuleType) -> None:
        calls.append("w1")
        hooks.w1_called.set()  # type: ignore[attr-defined]
        calls.append(importlib.import_module(two).DONE)

    modules.watch(w1, on_w1)
    modules.watch(w2, lambda module: calls.append("w2"))
    second = threading.Thread(target=importlib.import_module, args=(two,), daemon=True)
    second.start()
    assert hooks.two_started.wait(JOIN_S)  # type: ignore[attr-defined]
    first = threading.Thread(target=importlib.import_module, args=(one,), daemon=True)
    first.start()
    assert _joined(first) and _joined(second), "deadlocked"
    assert sorted(calls) == ["two", "w1", "w2"]


@pytest.mark.subprocess()
def test_wrapts_own_hook_on_the_same_module_and_ours_each_fire_once(modules: Modules) -> None:
    """wrapt's `register_post_import_hook` watching the module ours watches: wrapt's finder asks the
    import system again from inside its own `find_spec`, which comes back to ours; the per-thread
    guard sends that look-up to the finders behind us, or ours chained twice and fired twice."""
    import wrapt

    name = modules.write("both_watch", "DONE = 1\n")
    calls: list[str] = []
    wrapt.register_post_import_hook(lambda module: calls.append("wrapt"), name)
    modules.watch(name, lambda module: calls.append("ours"))
    assert sys.meta_path[0] is modules.hook and any(type(f).__module__ == "wrapt.importer" for f in sys.meta_path)
    importlib.import_module(name)
    assert sorted(calls) == ["ours", "wrapt"]


# --- fork: the hook's at-fork hooks (os.register_at_fork), in a child interpreter of its own each (the
# hooks of every hook made there stay registered for the rest of that process).


def _fork_and_reap() -> int:
    """Fork; the child exits at once (os._exit: nothing of the test runs twice); the child's status."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _timed_fork_and_reap() -> tuple[int, float]:
    """`_fork_and_reap`, and how long the fork took to come back in the parent (its hooks' wait)."""
    start = time.monotonic()
    status = _fork_and_reap()
    return status, time.monotonic() - start


@pytest.mark.subprocess()
def test_after_a_fork_the_parents_other_threads_still_run_callbacks(modules: Modules) -> None:
    """The fork holds the hook's lock across itself (a child must not copy it half done) and hands
    it back after, in the parent too: another thread's watched import then fires as before."""
    name = modules.write("after_fork", "DONE = 1\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    assert _fork_and_reap() == 0
    thread = threading.Thread(target=importlib.import_module, args=(name,), daemon=True)
    thread.start()
    assert _joined(thread), "the hook's lock was kept by the thread that forked"
    assert calls == [(sys.modules[name], 1)]


@pytest.mark.subprocess()
def test_a_fork_waits_for_a_callback_in_flight_only_as_long_as_fork_wait_s(
    modules: Modules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callback stuck on another thread longer than FORK_WAIT_S is the application's hang: the fork
    goes on at the end of that wait instead of waiting with it."""
    import te_offload_shim._hook as hook_module

    monkeypatch.setattr(hook_module, "FORK_WAIT_S", 0.1)
    name = modules.write("stuck_callback", "DONE = 1\n")
    entered, release = threading.Event(), threading.Event()

    def stuck(module: ModuleType) -> None:
        entered.set()
        release.wait(JOIN_S)

    modules.watch(name, stuck)
    thread = threading.Thread(target=importlib.import_module, args=(name,), daemon=True)
    thread.start()
    try:
        assert entered.wait(JOIN_S)
        status, waited = _timed_fork_and_reap()
    finally:
        release.set()
    assert _joined(thread) and status == 0
    assert 0.05 < waited < 0.7, f"the fork waited {waited:.2f} s for a callback stuck for good"


@pytest.mark.subprocess()
def test_a_fork_while_the_lock_is_held_and_a_callback_runs_raises_nothing(
    modules: Modules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uninstall holds the hook's lock past FORK_WAIT_S (its restore is slow) while another thread
    runs a callback: the fork goes on without the lock once FORK_WAIT_S is over, not later, and the
    hook's at-fork hooks raise nothing (Python would print it at the fork)."""
    import te_offload_shim._hook as hook_module

    monkeypatch.setattr(hook_module, "FORK_WAIT_S", 0.3)
    raised: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    name = modules.write("in_flight_at_fork", "DONE = 1\n")
    in_callback, in_restore, release = threading.Event(), threading.Event(), threading.Event()

    def stuck(module: ModuleType) -> None:
        in_callback.set()
        release.wait(JOIN_S)

    def slow_restore() -> int:
        in_restore.set()
        release.wait(JOIN_S)
        return 0

    modules.watch(name, stuck)
    firing = threading.Thread(target=importlib.import_module, args=(name,), daemon=True)
    firing.start()
    assert in_callback.wait(JOIN_S)
    uninstalling = threading.Thread(target=modules.hook.uninstall, args=(slow_restore,), daemon=True)
    uninstalling.start()
    try:
        assert in_restore.wait(JOIN_S)
        status, waited = _timed_fork_and_reap()
    finally:
        release.set()
    assert _joined(firing) and _joined(uninstalling) and status == 0
    assert raised == []
    assert 0.25 < waited < 0.8, f"the fork waited {waited:.2f} s for a lock held for good (FORK_WAIT_S 0.3)"


@pytest.mark.subprocess()
def test_a_child_forked_while_another_thread_runs_a_callback_fires_that_module_itself(modules: Modules) -> None:
    """Another thread runs the callback of a module loaded without our finder (a finished module, due)
    when this one forks: that thread does not exist in the child, where the callback never ends, so
    there the module is due again, and fires at the child's next import."""
    name = modules.write("in_flight_in_parent", "DONE = 1\n")
    parent = os.getpid()
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def callback(module: ModuleType) -> None:
        calls.append(os.getpid())
        if os.getpid() == parent:
            entered.set()
            release.wait(JOIN_S)

    modules.watch(name, callback)
    _load_behind_its_back(modules, name)
    trigger = modules.write("parent_trigger", "")
    firing = threading.Thread(target=importlib.import_module, args=(trigger,), daemon=True)
    firing.start()
    try:
        assert entered.wait(JOIN_S)
        pid = os.fork()
        if pid == 0:
            importlib.import_module(modules.write("child_trigger", ""))
            os._exit(10 + len(calls))  # 12: it fired here too
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        release.set()
    assert _joined(firing)
    assert status == 12, "the module whose callback the parent's other thread ran was not fired in the child"


@pytest.mark.parametrize(
    "returns_in_child",
    [pytest.param(r, marks=pytest.mark.subprocess(), id=("stays", "returns")[r]) for r in (False, True)],
)
def test_a_callback_that_forks_runs_once_in_the_child(modules: Modules, returns_in_child: bool) -> None:
    """A callback that forks (here of a module loaded without our finder, fired at the end of another
    import). Its child either stays in it, where the callback still runs on this thread, or returns
    from it (a fork-server start), where its end records the module as fired though the fork
    cleared the claims. Either way an import in the child runs nothing of it again."""
    name = modules.write("forks_in_callback", "DONE = 1\n")
    parent = os.getpid()
    calls: list[int] = []
    status: list[int] = []

    def in_child_then_exit() -> None:
        importlib.import_module(modules.write("trigger_in_child", ""))
        os._exit(10 + len(calls))  # 11: once, in the parent before the fork

    def callback(module: ModuleType) -> None:
        calls.append(os.getpid())
        if len(calls) > 1:
            return
        pid = os.fork()
        if pid:
            status.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        elif not returns_in_child:
            in_child_then_exit()

    modules.watch(name, callback)
    _load_behind_its_back(modules, name)
    importlib.import_module(modules.write("trigger_in_parent", ""))
    if os.getpid() != parent:  # the child, its callback returned
        in_child_then_exit()
    assert status == [11] and calls == [parent]


class ForksWhenAsked:
    """A finder behind ours that forks while it is asked for `name` (once). In the child it looks
    `name` up again, as a finder that defers to the import system would, and exits: 0 where that
    look-up came back unchained (ours left it to the finders behind it), 1 where ours chained it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.status: int | None = None

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname != self.name or self.status is not None:
            return None
        self.status = -1
        pid = os.fork()
        if pid == 0:
            spec = importlib.util.find_spec(fullname)
            os._exit(1 if spec is None or type(spec.loader) is ChainedLoader else 0)
        self.status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return None


@pytest.mark.subprocess()
def test_a_fork_inside_our_look_up_keeps_that_look_up_ours_in_the_child(modules: Modules) -> None:
    """A fork on the thread that is inside ours (a finder behind ours forks): in the child that thread
    is still inside it, so its look-up of the same name comes back to the finders behind, as in the
    parent; the fork clears only other threads' marks."""
    name = modules.write("forked_in_look_up", "DONE = 1\n")
    calls: list = []
    modules.watch(name, recorder(calls))
    finder = ForksWhenAsked(name)
    with behind_ours(modules.hook, finder):
        module = importlib.import_module(name)
    assert finder.status == 0, "in the child, ours chained its own look-up again"
    assert calls == [(module, 1)]


@pytest.mark.subprocess()
def test_a_child_thread_that_reuses_the_ident_of_a_parent_thread_inside_an_import_fires_at_its_end(
    modules: Modules,
) -> None:
    """Another thread is inside a watched module's body when this one forks. In the child that
    thread is gone, and a new thread there takes its ident (glibc hands the freed stack on): that
    thread's import is its outermost, so what is due fires at its end. Had the fork kept the gone
    thread's import depth, the new one would be taken as nested in it and fire nothing."""
    hooks = sys.modules[HOOKS]
    hooks.entered, hooks.release = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    body = modules.write(
        "body_at_fork",
        "import sys, threading\nhooks = sys.modules['watch_probe_hooks']\n"
        "hooks.inside = threading.get_ident()\nhooks.entered.set()\nhooks.release.wait(10)\n",
    )
    due = modules.write("due_in_child", "DONE = 1\n")
    calls: list = []
    modules.watch(body, recorder([]))
    modules.watch(due, recorder(calls))
    importing = threading.Thread(target=importlib.import_module, args=(body,), daemon=True)
    importing.start()
    try:
        assert hooks.entered.wait(JOIN_S)  # type: ignore[attr-defined]
        pid = os.fork()
        if pid == 0:
            _load_behind_its_back(modules, due)
            seen: list = []

            def import_trigger() -> None:
                seen.append(threading.get_ident())
                importlib.import_module(modules.write("trigger_in_child_thread", ""))
                seen.append(len(calls))

            thread = threading.Thread(target=import_trigger)
            thread.start()
            thread.join(JOIN_S)
            os._exit(3 if seen[:1] != [hooks.inside] else 10 + seen[1])  # type: ignore[attr-defined]
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        hooks.release.set()  # type: ignore[attr-defined]
    assert _joined(importing)
    assert status != 3, "the child's new thread did not take the gone thread's ident: nothing shown"
    assert status == 11, "what was due did not fire at the end of the child thread's outermost import"
