"""The post-import hook (the finder, its chained loader and `_fire` in te_offload_shim/__init__.py),
in this process.

Each test writes its own modules, under names no other test uses, to a temporary directory, and
watches them with callbacks of its own, named `module:function` as the start-up's table names
its callbacks. It leaves the hook as it found it (the shim may be installed in this process by
another test), with its modules and path entry gone.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import te_offload_shim as shim

_serial = itertools.count()
HOOKS = "watch_probe_hooks"  # the module the tests' callbacks are named in


class Modules:
    """Module files in one directory on sys.path, named `<prefix>_<name>`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.prefix = f"watch_probe_{next(_serial)}"

    def write(self, name: str, source: str) -> str:
        full = f"{self.prefix}_{name}"
        (self.directory / f"{full}.py").write_text(source)
        importlib.invalidate_caches()
        return full


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Modules]:
    saved = (shim._installed, shim._watched, dict(shim._fired), list(shim._hook_errors), list(sys.meta_path))
    shim._watched = {}
    sys.modules[HOOKS] = ModuleType(HOOKS)
    sys.path.insert(0, str(tmp_path))
    made = Modules(tmp_path)
    try:
        yield made
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith(made.prefix) or n == HOOKS]:
            del sys.modules[name]
        shim._installed, shim._watched = saved[0], saved[1]
        shim._fired.clear()
        shim._fired.update(saved[2])
        shim._hook_errors[:] = saved[3]
        sys.meta_path = saved[4]
        importlib.invalidate_caches()


def watch(name: str, callback: Callable[[ModuleType], None]) -> None:
    """What install() does for one more watched name: the finder in front, and what is due fired."""
    setattr(sys.modules[HOOKS], f"on_{name}", callback)
    shim._watched = {**shim._watched, name: f"{HOOKS}:on_{name}"}
    shim._to_front()
    shim._fire()


def recorder(calls: list) -> Callable[[ModuleType], None]:
    """A callback that records the module and what its body had defined by then."""

    def callback(module: ModuleType) -> None:
        calls.append((module, getattr(module, "DONE", None)))

    return callback


def test_fires_after_the_module_body_once_with_the_real_loader_back(modules: Modules) -> None:
    name = modules.write("plain", "DONE = 'body ran to its end'\n")
    calls: list = []
    watch(name, recorder(calls))
    assert sys.meta_path[0] is shim._finder
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
    watch(name, recorder(calls))
    assert calls == [(module, True)]
    importlib.import_module(modules.write("later", ""))
    assert len(calls) == 1


def test_the_finder_answers_only_for_watched_names(modules: Modules) -> None:
    watched = modules.write("watched", "DONE = 1\n")
    other = modules.write("other", "DONE = 1\n")
    watch(watched, recorder([]))
    spec = shim._finder.find_spec(watched)
    assert spec is not None and type(spec.loader) is shim._Chained
    assert shim._finder.find_spec(other) is None
    assert shim._finder.find_spec(f"{modules.prefix}_nowhere") is None, "a watched name nobody can find"


def test_the_finder_imports_nothing() -> None:
    """`find_spec` runs under the import system's global lock: it loads no module of any kind."""
    before = set(sys.modules)
    for name in ("json", "verl.utils.megatron_utils", "a_module_nobody_has"):
        shim._finder.find_spec(name)
    assert set(sys.modules) == before


def test_a_new_module_object_fires_again_and_reload_fires_again(modules: Modules) -> None:
    name = modules.write("again", "DONE = object()\n")
    calls: list = []
    watch(name, recorder(calls))
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
    watch(name, recorder(calls))
    assert shim._uninstall(lambda: 0) == 0
    assert shim._finder not in sys.meta_path
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
    watch(name, recorder(calls))
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
    sys.modules[HOOKS].watch = watch  # type: ignore[attr-defined]
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
    sys.modules[HOOKS].watch = watch  # type: ignore[attr-defined]
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

    watch(name, boom)
    watch(later, recorder(calls))
    module = importlib.import_module(name)  # must not raise
    assert module.DONE == 1
    assert f"{name}: ValueError: callback failed" in shim._hook_errors
    assert importlib.import_module(later).DONE == 2 and len(calls) == 1, "the other modules still fire"


def test_the_applications_interrupt_in_a_callback_reaches_it_and_the_next_import_fires(modules: Modules) -> None:
    """KeyboardInterrupt (Ctrl-C, Ray's cancel) during a callback fails the import, as it would have
    in the module's last line; importing it again runs the body and the callbacks afresh."""
    name = modules.write(
        "interrupted", "import builtins\nbuiltins.INTERRUPTED_RUNS = getattr(builtins, 'INTERRUPTED_RUNS', 0) + 1\n"
    )
    calls: list = []

    def interrupted_once(module: ModuleType) -> None:
        if not calls:
            calls.append("interrupted")
            raise KeyboardInterrupt
        calls.append(module)

    watch(name, interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        importlib.import_module(name)
    assert name not in sys.modules
    module = importlib.import_module(name)
    import builtins

    assert calls == ["interrupted", module] and builtins.INTERRUPTED_RUNS == 2  # type: ignore[attr-defined]
    del builtins.INTERRUPTED_RUNS  # type: ignore[attr-defined]


def test_what_is_due_is_read_from_one_watch_table_while_another_thread_replaces_it(modules: Modules) -> None:
    """Two watched modules due at once are put in the watch table's order. An uninstall on another
    thread replaces the table meanwhile (here: while the first module's `__spec__` is read): the
    order still comes from the table they were found in; a second read found none of them and raised
    (ValueError) out of the finder, into the application's import."""

    class Spec:
        @property
        def _initializing(self) -> bool:
            shim._watched = {}  # what `_uninstall` does, on another thread
            return False

    names = [modules.write(n, "") for n in ("second", "first")]
    for name in names:
        module = ModuleType(name)
        module.__spec__ = Spec()  # type: ignore[assignment]
        sys.modules[name] = module
    shim._watched = {names[1]: f"{HOOKS}:on_first", names[0]: f"{HOOKS}:on_second"}
    assert [name for name, _ in shim._due()] == [names[1], names[0]]


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

    watch(outer, on_outer)
    watch(inner, on_inner)
    importlib.import_module(outer)
    assert order == ["outer start", "outer end", "inner saw inner"]
    importlib.import_module(modules.write("later", ""))
    assert len(order) == 3, "and only once"
