"""Scenarios 1, 3, 4, 5, 10, 15 and 16: the import system with the shim in it behaves as without it.

Each test runs in a fresh interpreter: which modules are loaded, which finders are on the meta
path and which threads import what is the whole point.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hostile_util import cached_layer, use_targets, write_module

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

VERL_ROUTE = {"VERL_USE_EXTERNAL_MODULES": "te_offload_shim"}


@pytest.mark.subprocess(verl="0.8.0", env=VERL_ROUTE, timeout=300)
def test_verl_external_modules_route_while_the_main_thread_imports_the_shim() -> None:
    """Scenario 1: thread B imports verl's offload module, whose package imports the shim at its
    end (VERL_USE_EXTERNAL_MODULES); meanwhile the main thread imports the shim for the first
    time. Nobody may wait on anybody's import: both imports succeed, and the target is patched."""
    import importlib._bootstrap as bootstrap

    from harness.megatron_world import apply_cpu_quirks

    apply_cpu_quirks()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            import verl.utils.megatron_utils  # noqa: F401
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    name = "verl.utils.megatron_utils"
    # B holds the target's lock (`_module_locks`: a CPython internal that typeshed does not list)
    while name not in bootstrap._module_locks and thread.is_alive():  # type: ignore[attr-defined]
        pass
    assert "te_offload_shim" not in sys.modules, "B must still be in verl/__init__"
    import te_offload_shim

    thread.join(120)
    assert not thread.is_alive() and errors == [], errors
    import torch

    mu = sys.modules[name]
    assert te_offload_shim.status()["targets"][0]["state"] == "patched"
    layer = cached_layer()
    mu.offload_megatron_model_to_cpu([torch.nn.Sequential(layer)])  # verl's plain-module path
    assert layer._fp8_workspaces == {}


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "imports_the_shim:offload"})
def test_a_target_module_that_imports_the_shim_itself_is_patched_at_the_next_import(tmp_path: Path) -> None:
    """Scenario 3: the shim installs halfway through the target's own import. It is not patched half
    built; the process's next import, once the target has finished, patches it."""
    use_targets()
    write_module(tmp_path, "any_next_import", "")
    imports_the_shim = importlib.import_module("imports_the_shim")  # before the shim, which it imports
    te_offload_shim = sys.modules["te_offload_shim"]
    assert te_offload_shim.HOOK.errors == {}, "nothing was patched half built"
    importlib.import_module("any_next_import")

    layer = cached_layer()
    assert imports_the_shim.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}, "cleared by the wrapper installed at the next import"
    rows = {r["name"]: r["state"] for r in te_offload_shim.status()["targets"]}
    assert rows["imports_the_shim:offload"] == "patched"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "imports_the_shim:offload"}, fresh=True)
def test_what_is_due_fires_after_a_packages_whole_import_not_inside_it() -> None:
    """Scenario 3, when the next import is the first of wrapt, which the patch itself needs: wrapt's
    `__init__` imports `wrapt.wrappers` first, and firing at the end of that submodule handed the
    callback a half-built wrapt (`partially initialized module 'wrapt' has no attribute
    'BoundFunctionWrapper'`), and the target stayed unpatched for the whole run. What is due fires at
    the end of the outermost import of the thread."""
    use_targets()
    assert "wrapt" not in sys.modules, "a fresh interpreter: the next import is wrapt's first"
    imports_the_shim = importlib.import_module("imports_the_shim")
    te_offload_shim = sys.modules["te_offload_shim"]
    importlib.import_module("wrapt")  # the next import: a package that imports its submodules

    assert te_offload_shim.HOOK.errors == {}, te_offload_shim.HOOK.errors
    layer = cached_layer()
    assert imports_the_shim.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}, "cleared by the wrapper installed after wrapt's import"


class _FrontFinder:
    """A finder that puts itself first and serves one module, as pytest's assertion rewriter does
    for the modules it rewrites."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.served = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        from importlib.machinery import PathFinder

        self.served += 1
        return PathFinder.find_spec(fullname, path)


@pytest.mark.subprocess(activate=True, env={"TE_OFFLOAD_SHIM_TARGETS": "front_a:offload,front_b:offload"})
def test_a_finder_put_in_front_of_ours_does_not_keep_a_target_unpatched(tmp_path: Path) -> None:
    """Scenario 4: the shim is active from interpreter start, then a finder goes in front of ours."""
    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    assert te_offload_shim.installed()
    source = "def offload(models):\n    return 'offloaded'\n"
    write_module(tmp_path, "front_a", source)
    write_module(tmp_path, "front_b", source)
    write_module(tmp_path, "unrelated", "")
    finder_a, finder_b = _FrontFinder("front_a"), _FrontFinder("front_b")
    sys.meta_path.insert(0, finder_a)
    importlib.import_module("unrelated")  # the process goes on importing, as pytest does after inserting its hook
    front_a = importlib.import_module("front_a")

    assert finder_a.served == 1 and shim_layers(front_a.offload) == 1, "served by the other finder, and patched"
    # Worst case: the other finder goes in front and the target is the very next import.
    sys.meta_path.insert(0, finder_b)
    front_b = importlib.import_module("front_b")
    assert finder_b.served == 1
    importlib.import_module("json.tool")  # any later import of the process

    assert shim_layers(front_b.offload) == 1, "patched at the process's next import at the latest"


class _LegacyLoader:
    def __init__(self, source: str) -> None:
        self.source = source

    def load_module(self, fullname: str) -> ModuleType:
        import types

        module = types.ModuleType(fullname)
        module.__loader__ = self
        sys.modules[fullname] = module
        exec(self.source, module.__dict__)
        return module


class _LegacyFinder:
    """Only `find_module`, as finders written before Python 3.4 have (Python <= 3.11 uses them)."""

    def find_module(self, fullname: str, path: object = None) -> _LegacyLoader | None:
        if fullname == "legacy_target":
            return _LegacyLoader("SOURCE = 'legacy finder'\ndef offload(models):\n    return 'legacy'\n")
        return None


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 dropped find_module finders")
@pytest.mark.parametrize("where", ["in front, before install", "in front", "behind ours, before the path finder"])
@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "legacy_target:offload,disk_target:offload"})
def test_a_legacy_finder_still_serves_its_module_and_it_is_patched(tmp_path: Path, where: str) -> None:
    """Scenario 4: the module a legacy finder serves is the one imported, with or without us, wherever
    it stands; its loader has only `load_module`, which ours does not chain: the module is patched at
    the end of the process's next import. Every other target is still patched at its own import."""
    import warnings
    from importlib.machinery import PathFinder

    write_module(tmp_path, "legacy_target", "SOURCE = 'disk'\ndef offload(models):\n    return 'disk'\n")
    write_module(tmp_path, "disk_target", "def offload(models):\n    return 'disk'\n")
    legacy = _LegacyFinder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)  # 3.10 and 3.11 warn at each import that asks it
        if where == "in front, before install":
            sys.meta_path.insert(0, legacy)  # type: ignore[arg-type]  # find_module only, no find_spec
        te_offload_shim = importlib.import_module("te_offload_shim")
        from te_offload_shim.engine.patch import shim_layers

        if where == "in front":
            sys.meta_path.insert(0, legacy)  # type: ignore[arg-type]
        elif where == "behind ours, before the path finder":
            sys.meta_path.insert(sys.meta_path.index(PathFinder), legacy)  # type: ignore[arg-type]
        legacy_target = importlib.import_module("legacy_target")
        assert legacy_target.SOURCE == "legacy finder", "served by the legacy finder, as without us"
        assert type(legacy_target.__loader__) is _LegacyLoader
        assert shim_layers(legacy_target.offload) == 0, "not chained: it is due at the next import"
        disk_target = importlib.import_module("disk_target")  # the process's next import
    assert shim_layers(disk_target.offload) == 1, "a target the path finder serves is chained still"
    assert shim_layers(legacy_target.offload) == 1, "patched at the end of the next import"
    layer = cached_layer()
    assert legacy_target.offload([layer]) == "legacy" and layer._fp8_workspaces == {}
    assert te_offload_shim.status()["hook_errors"] == []


class _LegacyLoaderFinder:
    """A finder of today's protocol whose loader has only `load_module` (any Python up to 3.13 loads
    with it, warning)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != "legacy_loaded":
            return None
        source = "SOURCE = 'legacy loader'\ndef offload(models):\n    return 'legacy'\n"
        return importlib.util.spec_from_loader(fullname, _LegacyLoader(source))  # type: ignore[arg-type]


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "legacy_loaded:offload,disk_target:offload"})
def test_a_legacy_loader_still_loads_its_module_and_it_is_patched(tmp_path: Path) -> None:
    """Scenario 4: a loader without `exec_module` is not chained; it loads its module as without us,
    and the module is patched at the end of the process's next import."""
    import warnings

    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    write_module(tmp_path, "legacy_loaded", "SOURCE = 'disk'\ndef offload(models):\n    return 'disk'\n")
    write_module(tmp_path, "disk_target", "def offload(models):\n    return 'disk'\n")
    sys.meta_path.insert(0, _LegacyLoaderFinder())  # ours moves back in front of it and asks it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)
        legacy_loaded = importlib.import_module("legacy_loaded")
    assert legacy_loaded.SOURCE == "legacy loader", "loaded by the finder's loader, as without us"
    assert type(legacy_loaded.__loader__) is _LegacyLoader
    assert shim_layers(legacy_loaded.offload) == 0, "not chained: it is due at the next import"
    disk_target = importlib.import_module("disk_target")  # the process's next import
    assert shim_layers(disk_target.offload) == 1 and sys.meta_path[0] is te_offload_shim.HOOK
    assert shim_layers(legacy_loaded.offload) == 1, "patched at the end of the next import"
    layer = cached_layer()
    assert legacy_loaded.offload([layer]) == "legacy" and layer._fp8_workspaces == {}
    assert te_offload_shim.status()["hook_errors"] == []


LAZY_SOURCE = """
import builtins
builtins.LAZY_RUNS = getattr(builtins, "LAZY_RUNS", 0) + 1
raise ImportError("this lazy module must never be executed by the shim")
"""


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "plain_target:offload"})
def test_lazily_imported_modules_stay_unexecuted(tmp_path: Path) -> None:
    """Scenario 5: patching rebinds aliases in every loaded module; a lazy one must not load."""
    import builtins

    write_module(tmp_path, "lazy_victim", LAZY_SOURCE)
    write_module(tmp_path, "plain_target", "def offload(models):\n    return 'offloaded'\n")
    spec = importlib.util.find_spec("lazy_victim")
    assert spec is not None and spec.loader is not None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    lazy = importlib.util.module_from_spec(spec)
    sys.modules["lazy_victim"] = lazy
    spec.loader.exec_module(lazy)
    te_offload_shim = importlib.import_module("te_offload_shim")
    plain_target = importlib.import_module("plain_target")
    from te_offload_shim.engine.patch import shim_layers

    assert shim_layers(plain_target.offload) == 1
    assert getattr(builtins, "LAZY_RUNS", 0) == 0, "the lazy module was executed"
    rows = {r["name"]: r["state"] for r in te_offload_shim.status()["targets"]}
    assert rows["plain_target:offload"] == "patched"
    assert te_offload_shim.uninstall() == 1
    assert not te_offload_shim.installed() and shim_layers(plain_target.offload) == 0
    assert not any(type(f).__module__.startswith("te_offload_shim") for f in sys.meta_path)
    assert getattr(builtins, "LAZY_RUNS", 0) == 0


FAILING_SOURCE = """
import builtins, threading
builtins.FAILING_RUNS = getattr(builtins, "FAILING_RUNS", 0) + 1
builtins.FAILING_STARTED.set()
builtins.FAILING_GO.wait(5)
raise RuntimeError("the application's import fails")
"""


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "failing_target:offload"})
def test_a_failed_import_on_another_thread_is_not_run_again(tmp_path: Path) -> None:
    """Scenario 5: install() while a target's import runs on another thread, which then fails:
    the module body ran once, and no half-built module is left behind."""
    import builtins

    write_module(tmp_path, "failing_target", FAILING_SOURCE)
    builtins.FAILING_STARTED = threading.Event()  # type: ignore[attr-defined]
    builtins.FAILING_GO = threading.Event()  # type: ignore[attr-defined]
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            import failing_target  # noqa: F401
        except RuntimeError as exc:
            failures.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert builtins.FAILING_STARTED.wait(10)  # type: ignore[attr-defined]
    timer = threading.Timer(0.5, builtins.FAILING_GO.set)  # type: ignore[attr-defined]
    timer.start()
    import te_offload_shim

    thread.join(30)
    timer.join()
    assert len(failures) == 1
    assert builtins.FAILING_RUNS == 1, "the shim imported the failing module again"  # type: ignore[attr-defined]
    assert "failing_target" not in sys.modules
    assert te_offload_shim.installed()


def _read_only_module_type() -> type:
    """A module type whose `__loader__` cannot be assigned."""
    import types

    class ReadOnlyLoader(types.ModuleType):
        @property  # type: ignore[override]  # deliberately read-only
        def __loader__(self) -> object:
            return self.__dict__.get("_loader")

        @__loader__.setter
        def __loader__(self, value: object) -> None:
            raise AttributeError("__loader__ is read-only in this module type")

    return ReadOnlyLoader


class _ReadOnlyFinder:
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "readonly_target":
            return None
        import importlib.util

        # create_module/exec_module are all the import system uses; typeshed's LoaderProtocol wants load_module
        return importlib.util.spec_from_loader(fullname, _ReadOnlyModuleLoader())  # type: ignore[arg-type]


class _ReadOnlyModuleLoader:
    def create_module(self, spec: object) -> object:
        return _read_only_module_type()("readonly_target")

    def exec_module(self, module: object) -> None:
        exec("def offload(models):\n    return 'offloaded'\n", module.__dict__)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "readonly_target:offload"})
def test_an_import_that_works_without_the_shim_works_with_it() -> None:
    """Scenario 10: our loader must not assume it may set attributes on the module."""
    sys.meta_path.append(_ReadOnlyFinder())
    te_offload_shim = importlib.import_module("te_offload_shim")
    readonly_target = importlib.import_module("readonly_target")
    from te_offload_shim.engine.patch import shim_layers

    assert readonly_target.offload([]) == "offloaded" and shim_layers(readonly_target.offload) == 1
    assert te_offload_shim.status()["hook_errors"] == []


class _PausingFinder:
    """Stops the import of one module on its thread, inside the import system's walk over the meta
    path, until told to go on; then lets the rest of the meta path find it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inside, self.go_on = threading.Event(), threading.Event()

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == self.name:
            self.inside.set()
            self.go_on.wait(10)


@pytest.mark.subprocess()
def test_uninstall_does_not_break_an_import_in_flight_on_another_thread(tmp_path: Path) -> None:
    """Scenario 15: uninstall() while another thread's import is walking the meta path (stopped
    just before the path finder). An in-place edit of the list would make that walk skip a finder."""
    from importlib.machinery import PathFinder

    import te_offload_shim

    write_module(tmp_path, "walked_module", "VALUE = 1\n")
    pausing = _PausingFinder("walked_module")
    sys.meta_path.insert(sys.meta_path.index(PathFinder), pausing)
    failures: list[BaseException] = []

    def importer() -> None:
        try:
            importlib.import_module("walked_module")
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=importer)
    thread.start()
    assert pausing.inside.wait(10)
    te_offload_shim.uninstall()
    pausing.go_on.set()
    thread.join(10)
    assert failures == [] and sys.modules["walked_module"].VALUE == 1, failures


@pytest.mark.subprocess(fresh=True)
def test_the_finder_imports_nothing() -> None:
    """Scenario 16: `find_spec` runs under the import system's global lock: it brings no module in,
    for a watched name, another name, or a name nobody has."""
    import te_offload_shim as shim

    before = set(sys.modules)
    for name in ("verl.utils.megatron_utils", "json", "a_module_nobody_has"):
        shim.HOOK.find_spec(name)
    assert set(sys.modules) == before


@pytest.mark.subprocess(fresh=True)
def test_a_watched_import_does_not_wait_for_a_thread_importing_the_shims_modules(tmp_path: Path) -> None:
    """Scenario 16: another thread holds the module lock of the module the table's callback lives in
    (`te_offload_shim.integrations.table`: it is importing it). Finding the watched module waits for
    nothing (an import statement inside find_spec would, under the import system's global lock); the
    callbacks, after the module's body, wait for that import to finish as any module's body would,
    and run."""
    import threading
    import time
    from importlib import _bootstrap  # type: ignore[attr-defined]

    (tmp_path / "firing_race_target.py").write_text("def offload(models):\n    return 'offloaded'\n")
    sys.path.insert(0, str(tmp_path))
    os.environ["TE_OFFLOAD_SHIM_TARGETS"] = "firing_race_target:offload"
    import te_offload_shim  # noqa: F401  (installs the shim, as a real process does)
    from te_offload_shim._hook import ChainedLoader

    holding, release = threading.Event(), threading.Event()

    def hold_the_module_lock() -> None:
        table = "te_offload_shim.integrations.table"
        with _bootstrap._ModuleLockManager(table):  # type: ignore[attr-defined]  # CPython internal
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_module_lock, daemon=True)
    holder.start()
    assert holding.wait(10)
    started = time.monotonic()
    spec = importlib.util.find_spec("firing_race_target")  # through our finder
    found_in = time.monotonic() - started
    importer = threading.Thread(target=importlib.import_module, args=("firing_race_target",), daemon=True)
    importer.start()
    time.sleep(0.2)
    release.set()
    importer.join(10)
    holder.join(10)
    assert found_in < 5 and spec is not None and type(spec.loader) is ChainedLoader, found_in
    assert not importer.is_alive(), "the import never finished"
    from te_offload_shim.engine.patch import shim_layers

    assert shim_layers(sys.modules["firing_race_target"].offload) == 1


@pytest.mark.subprocess(fresh=True, env={"TE_OFFLOAD_SHIM": "0"})
def test_callbacks_that_cannot_load_fail_no_import_and_no_install(tmp_path: Path) -> None:
    """Scenario 16: a broken install, where the module the table's callback lives in
    (integrations/table.py) raises as it loads. `install()` and every import still work (the targets
    run unpatched), and status's hook errors say why."""
    import os

    import te_offload_shim as shim
    from te_offload_shim import integrations
    from te_offload_shim.integrations import user_targets  # noqa: F401 - loaded before integrations/'s path breaks

    assert not shim.installed() and "te_offload_shim.integrations.table" not in sys.modules
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "table.py").write_text("raise RuntimeError('broken install')\n")
    write_module(tmp_path, "early_target", "def offload(models):\n    return 'early'\n")
    write_module(tmp_path, "late_target", "def offload(models):\n    return 'late'\n")
    early = importlib.import_module("early_target")
    os.environ.update(TE_OFFLOAD_SHIM="1", TE_OFFLOAD_SHIM_TARGETS="early_target:offload,late_target:offload")
    path = list(integrations.__path__)
    integrations.__path__[:] = [str(broken)]
    try:
        assert shim.install() is True, "an already imported target's callback fails: install must not raise"
        late = importlib.import_module("late_target")  # its callback fails too: the import must work
    finally:
        integrations.__path__[:] = path
    assert early.offload([]) == "early" and late.offload([]) == "late"
    failed = {module for module, why in shim.HOOK.errors.items() if "broken install" in why}
    assert failed == {"early_target", "late_target"}, shim.HOOK.errors
