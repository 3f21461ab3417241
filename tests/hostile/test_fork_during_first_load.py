"""A fork while another thread loads the shim's own modules waits for the load to finish: the child
imports its targets, and they are patched (issue 27, finding 2; issue 35).

The first target import loads the engine lazily, inside its post-import callback. `os.fork()`
copies the import system's per-module locks as they are, so a fork in the middle of that load (a
DataLoader or multiprocessing fork on the main thread while a worker thread imports verl) would
leave the child with the engine's modules locked by a thread that does not exist there, and half
built: its next target import would wait forever. The callbacks run under the hook's lock, which a
fork takes first (`os.register_at_fork`): the fork waits until the load is done.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hostile_util import cached_layer, child_exit_status, write_module

HELD = "te_offload_shim.engine.handler"  # imported by engine.patch's body: that one is half built
TARGETS = "first_load_target:offload,next_target:offload"


class _HoldImport:
    """A meta path finder that holds the import of one module (on whichever thread reaches it) just
    before its body runs, with the module lock taken, until the test lets it go."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entered, self.release = threading.Event(), threading.Event()
        self.armed = True

    def find_spec(self, fullname: str, path: Any = None, target: object = None) -> Any:
        if not self.armed or fullname != self.name:
            return None
        self.armed = False
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        assert spec is not None and spec.loader is not None
        spec.loader = _HoldingLoader(spec.loader, self)  # type: ignore[assignment]
        return spec


class _HoldingLoader:
    def __init__(self, loader: Any, hold: _HoldImport) -> None:
        self.loader, self.hold = loader, hold

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.hold.entered.set()
        self.hold.release.wait(30)
        self.loader.exec_module(module)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": TARGETS}, timeout=120)
def test_a_fork_while_a_thread_loads_the_engine_waits_and_the_child_patches_its_targets(tmp_path: Path) -> None:
    import warnings

    import te_offload_shim  # noqa: F401  (installs the shim; nothing of the engine is loaded)

    plain = "def offload(models):\n    return 'offloaded'\n"
    write_module(tmp_path, "first_load_target", plain)
    write_module(tmp_path, "next_target", plain)
    assert "te_offload_shim.engine.patch" not in sys.modules
    layers = [cached_layer(), cached_layer()]
    hold = _HoldImport(HELD)
    sys.meta_path.insert(0, hold)  # ours moves back in front of it; the path finder stays behind it
    loader = threading.Thread(target=importlib.import_module, args=("first_load_target",))
    loader.start()
    assert hold.entered.wait(30), "the worker thread's first target import is loading the engine"
    assert sys.modules["te_offload_shim.engine.patch"].__spec__._initializing  # type: ignore[union-attr]
    threading.Timer(1.0, hold.release.set).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads running
        pid = os.fork()
    loaded_before_the_fork_returned = not sys.modules["te_offload_shim.engine.patch"].__spec__._initializing  # type: ignore[union-attr]
    if pid == 0:  # the child: import a target the parent never imported, then the one loading at the fork
        try:
            nxt = importlib.import_module("next_target")
            nxt.offload([layers[0]])
            first = importlib.import_module("first_load_target")
            first.offload([layers[1]])
            code = 0 if layers[0]._fp8_workspaces == {} else 3
            code = code or (0 if layers[1]._fp8_workspaces == {} else 4)
            os._exit(code)
        except BaseException:
            os._exit(5)
    try:
        status = child_exit_status(pid, 30)
    finally:
        hold.release.set()
        loader.join(30)
    assert loaded_before_the_fork_returned, "the fork did not wait for the engine's load"
    assert status != 3, "the child's next target import was not patched"
    assert status != 4, "the target whose callback was running at the fork was not patched in the child"
    assert status == 0, f"the forked child {'hung' if status is None else f'exited {status}'}"
    assert sys.modules["first_load_target"].offload.__module__ == "first_load_target"  # the parent goes on
