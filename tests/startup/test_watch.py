"""The post-import watcher (`_Watcher` in te_offload_shim/__init__.py, and te_offload_shim/_post_import.py),
in this process.

Each test writes its own modules, under names no other test uses, to a temporary directory, and
leaves the watcher as it found it (the shim may be installed in this process by another test: its
watches are put back), with its modules and path entry gone.
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

import te_offload_shim
from te_offload_shim import _post_import

watcher = te_offload_shim._watcher

_serial = itertools.count()


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
    saved_callbacks = dict(watcher.callbacks)
    saved_fired = dict(watcher.fired)
    saved_handler = watcher.on_error
    saved_meta_path = list(sys.meta_path)
    _post_import.unwatch_all()
    sys.path.insert(0, str(tmp_path))
    made = Modules(tmp_path)
    try:
        yield made
    finally:
        _post_import.unwatch_all()
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith(made.prefix)]:
            del sys.modules[name]
        watcher.callbacks.update(saved_callbacks)
        watcher.fired.update(saved_fired)
        watcher.on_error = saved_handler
        sys.meta_path = saved_meta_path
        importlib.invalidate_caches()


def recorder(calls: list) -> Callable[[ModuleType], None]:
    """A callback that records the module and what its body had defined by then."""

    def callback(module: ModuleType) -> None:
        calls.append((module, getattr(module, "DONE", None)))

    return callback


def test_fires_after_the_module_body_once_with_the_real_loader_back(modules: Modules) -> None:
    name = modules.write("plain", "DONE = 'body ran to its end'\n")
    calls: list = []
    watcher.watch(recorder(calls), name)
    assert sys.meta_path[0] is watcher
    assert calls == [], "watching a module not imported yet runs nothing"

    module = importlib.import_module(name)
    assert calls == [(module, "body ran to its end")]
    # our proxy loader is gone from everything that outlives the import
    assert type(module.__loader__) is importlib.machinery.SourceFileLoader
    assert module.__spec__ is not None and type(module.__spec__.loader) is importlib.machinery.SourceFileLoader

    importlib.import_module(name)  # already imported: no new import, no new call
    _post_import.sweep()
    assert len(calls) == 1, "the callbacks run once per module object"


def test_watching_an_imported_module_fires_at_once(modules: Modules) -> None:
    name = modules.write("early", "DONE = True\n")
    module = importlib.import_module(name)
    calls: list = []
    watcher.watch(recorder(calls), name)
    assert calls == [(module, True)]
    _post_import.sweep()
    assert len(calls) == 1


def test_the_finder_answers_only_for_watched_names(modules: Modules) -> None:
    watched = modules.write("watched", "DONE = 1\n")
    other = modules.write("other", "DONE = 1\n")
    watcher.watch(recorder([]), watched)
    spec = watcher.find_spec(watched)
    assert spec is not None and isinstance(spec.loader, _post_import.ChainedLoader)
    assert watcher.find_spec(other) is None
    assert watcher.find_spec(f"{modules.prefix}_nowhere") is None, "a watched name nobody can find"


def test_a_new_module_object_fires_again_and_reload_fires_again(modules: Modules) -> None:
    name = modules.write("again", "DONE = object()\n")
    calls: list = []
    watcher.watch(recorder(calls), name)
    first = importlib.import_module(name)
    del sys.modules[name]
    second = importlib.import_module(name)
    assert second is not first
    assert [c[0] for c in calls] == [first, second]
    importlib.reload(second)
    assert [c[0] for c in calls] == [first, second, second], "the finder stays on the meta path for a reload"


def test_unwatch_all_takes_the_finder_off_and_stops_firing(modules: Modules) -> None:
    name = modules.write("dropped", "DONE = 1\n")
    calls: list = []
    watcher.watch(recorder(calls), name)
    _post_import.unwatch_all()
    assert watcher not in sys.meta_path
    importlib.import_module(name)
    _post_import.sweep()
    assert calls == []


def _load_behind_its_back(modules: Modules, name: str) -> ModuleType:
    """Load `name` as another finder put in front of ours would: plainly, without our finder."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(modules.directory)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_catch_up_fires_a_module_loaded_without_the_finder(modules: Modules) -> None:
    name = modules.write("unseen", "DONE = 'loaded behind our back'\n")
    calls: list = []
    watcher.watch(recorder(calls), name)
    module = _load_behind_its_back(modules, name)
    assert calls == []
    _post_import.sweep()
    assert calls == [(module, "loaded behind our back")]
    _post_import.sweep()
    assert len(calls) == 1


def test_the_next_import_through_the_finder_notices_it_too(modules: Modules) -> None:
    name = modules.write("unseen2", "DONE = 1\n")
    trigger = modules.write("trigger", "DONE = 1\n")
    calls: list = []
    watcher.watch(recorder(calls), name)
    module = _load_behind_its_back(modules, name)
    importlib.import_module(trigger)  # any import consults the finder: the sweep tags this import's spec
    assert calls == [(module, 1)], "fired when the unrelated import finished"


def test_an_import_in_flight_is_fired_when_it_finishes(modules: Modules) -> None:
    """`watch` called while the module's body runs (the module that imports the shim): its spec is
    tagged, and the import system's own `_initializing = False` at the end runs the callbacks."""
    calls: list = []
    seen: dict = {}

    def callback(module: ModuleType) -> None:
        seen["spec class during callback"] = type(module.__spec__)
        calls.append((module, getattr(module, "DONE", None)))

    sys.modules["watch_probe_hook"] = hook = ModuleType("watch_probe_hook")
    try:
        hook.callback = callback  # type: ignore[attr-defined]
        name = modules.write(
            "inflight",
            "import sys\n"
            "import te_offload_shim\nfrom te_offload_shim import _post_import\n"
            "te_offload_shim._watcher.watch(sys.modules['watch_probe_hook'].callback, __name__)\n"
            "TAGGED = type(__spec__) is _post_import.SpecWatch\n"
            "FIRED_EARLY = bool(sys.modules['watch_probe_hook'].calls)\n"
            "DONE = 'end of body'\n",
        )
        hook.calls = calls  # type: ignore[attr-defined]
        module = importlib.import_module(name)
    finally:
        del sys.modules["watch_probe_hook"]
    assert module.TAGGED and not module.FIRED_EARLY
    assert calls == [(module, "end of body")]
    assert type(module.__spec__) is importlib.machinery.ModuleSpec, "the spec gets its own class back"
    assert seen["spec class during callback"] is importlib.machinery.ModuleSpec


def test_a_failed_import_in_flight_fires_nothing(modules: Modules) -> None:
    calls: list = []
    sys.modules["watch_probe_hook2"] = hook = ModuleType("watch_probe_hook2")
    hook.callback = recorder(calls)  # type: ignore[attr-defined]
    try:
        name = modules.write(
            "fails",
            "import sys\n"
            "import te_offload_shim\nfrom te_offload_shim import _post_import\n"
            "te_offload_shim._watcher.watch(sys.modules['watch_probe_hook2'].callback, __name__)\n"
            "raise RuntimeError('the body fails')\n",
        )
        with pytest.raises(RuntimeError, match="the body fails"):
            importlib.import_module(name)
    finally:
        del sys.modules["watch_probe_hook2"]
    _post_import.sweep()
    assert calls == [] and name not in sys.modules


def test_a_callback_error_goes_to_the_handler_and_not_to_the_import(modules: Modules) -> None:
    name = modules.write("erring", "DONE = 1\n")
    errors: list = []
    later: list = []
    watcher.on_error = lambda module, exc: errors.append((module, exc))

    def boom(module: ModuleType) -> None:
        raise ValueError("callback failed")

    watcher.watch(boom, name)
    watcher.watch(recorder(later), name)
    module = importlib.import_module(name)  # must not raise
    assert [(n, type(e), str(e)) for n, e in errors] == [(name, ValueError, "callback failed")]
    assert later == [(module, 1)], "the next callback still runs"

    # a handler that fails itself is swallowed too
    watcher.on_error = lambda module, exc: 1 / 0  # type: ignore[assignment]  # raises, never returns
    del sys.modules[name]
    importlib.import_module(name)
    assert len(later) == 2


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

    watcher.watch(on_outer, outer)
    watcher.watch(on_inner, inner)
    importlib.import_module(outer)
    assert order == ["outer start", "outer end", "inner saw inner"]
    _post_import.sweep()
    assert len(order) == 3, "and only once"


def test_watch_from_inside_a_callback_runs_after_it(modules: Modules) -> None:
    first = modules.write("first", "DONE = 1\n")
    second = modules.write("second", "DONE = 2\n")
    importlib.import_module(second)
    order: list[str] = []

    def on_first(module: ModuleType) -> None:
        order.append("first start")
        watcher.watch(lambda m: order.append("second"), second)  # already imported: due, not run here
        order.append("first end")

    watcher.watch(on_first, first)
    importlib.import_module(first)
    assert order == ["first start", "first end", "second"]
