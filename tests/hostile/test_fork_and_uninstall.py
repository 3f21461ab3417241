"""Scenarios 2 and 9: a forked child can always use the shim, and `uninstall()` leaves nothing
that acts: not a wrapper someone wrapped again, not a Ray actor's method copy, not a patch that
was landing while it ran."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hostile_util import ALL_KINDS, cached_layer, child_exit_status, use_targets, write_module


def _package_locks() -> list[tuple[str, Any]]:
    """Every lock the package has made (`_locks.Lock`, which each lock of a module below the
    start-up is), and the start-up's own, the import hook's."""
    import te_offload_shim
    from te_offload_shim import _locks

    return [
        ("te_offload_shim._hook.HOOK", te_offload_shim.HOOK._lock),
        *((f"_locks._all[{i}]", lock) for i, lock in enumerate(_locks._all)),
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "fork_target:offload"})
def test_a_child_forked_while_every_lock_is_held_can_patch_clear_and_report(tmp_path: Path) -> None:
    """Scenario 2: fork at the worst moment, with each of the package's locks held by a thread
    (as while another thread is inside a patch, a clearing, a log line or install())."""
    import warnings

    import te_offload_shim
    from te_offload_shim import _log

    # the modules that make a lock, those loaded only on request included: every one is held
    from te_offload_shim.engine import handler, patch, stats_file  # noqa: F401
    from te_offload_shim.integrations import megatron_ddp  # noqa: F401
    from te_offload_shim.reports import audit  # noqa: F401
    from te_offload_shim.te import process_globals  # noqa: F401

    write_module(tmp_path, "fork_target", "def offload(models):\n    return 'offloaded'\n")
    layer = cached_layer()
    locks = _package_locks()
    assert len(locks) >= 6, locks  # the hook's; _log's, the registry's, the counters', the stats file's, megatron_ddp's
    holding, release = threading.Event(), threading.Event()

    def hold_all() -> None:
        for _, lock in locks:
            lock.__enter__()
        holding.set()
        release.wait()
        for _, lock in reversed(locks):
            lock.__exit__(None, None, None)

    holder = threading.Thread(target=hold_all)
    holder.start()
    assert holding.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads running
        pid = os.fork()
    if pid == 0:  # the child: patch, clear, count, log, report; any hang fails the parent's wait
        try:
            target = importlib.import_module("fork_target")
            target.offload([layer])
            ok = layer._fp8_workspaces == {} and te_offload_shim.stats()["entries"] == 1
            _log.warn_once("forked", "te_offload_shim: a warning from the forked child")
            te_offload_shim.status()
            te_offload_shim.uninstall()
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    try:
        status = child_exit_status(pid, 20)
    finally:
        release.set()
        holder.join()
    assert status == 0, f"the forked child {'hung' if status is None else f'exited {status}'}"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ALL_KINDS})
def test_uninstall_disarms_a_wrapper_that_something_wrapped_again() -> None:
    """Scenario 9: a decorator (a profiler, a retry) wrapped our wrapper after the patch, so the
    original cannot be put back in its place; it must stop clearing all the same."""
    import te_offload_shim

    use_targets()
    import shim_targets as t

    ours = t.offload
    t.offload = functools.wraps(ours)(lambda models: ours(models))  # a profiler's wrapper holds ours
    first = cached_layer()
    t.offload([first])
    assert first._fp8_workspaces == {}
    te_offload_shim.uninstall()
    second = cached_layer()
    assert t.offload([second]) == "offloaded"
    assert second._fp8_workspaces, "a disarmed wrapper must not clear"
    assert te_offload_shim.stats()["calls"] == 1


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ALL_KINDS})
def test_uninstall_restores_the_ray_actor_method_copies() -> None:
    """Scenario 9: a @ray.remote class runs copies of its methods (wrapped in Ray's tracing
    closure); the copies the shim wrapped in the worker are unwrapped by uninstall() too."""
    from support.ray_copies import actor_class_with_a_traced_copy

    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers
    from te_offload_shim.integrations import ray as ray_actors

    use_targets()
    import shim_targets as t

    actor_class, traced_copy = actor_class_with_a_traced_copy(t.Engine, "offload")
    assert ray_actors.patch_copies(actor_class) == 1
    assert shim_layers(vars(actor_class)["offload"]) == 1
    layer = cached_layer()
    actor_class().offload([layer])
    assert layer._fp8_workspaces == {}
    te_offload_shim.uninstall()
    assert vars(actor_class)["offload"] is traced_copy, "the copy is put back"
    assert shim_layers(vars(t.Engine)["offload"]) == 0


class _PausingFinder:
    """Holds the import of one module on its thread until told to go on, then lets the rest of
    the meta path find it: a way to stop a thread at an exact point inside the import system."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inside, self.go_on = threading.Event(), threading.Event()

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == self.name and threading.current_thread() is not threading.main_thread():
            self.inside.set()
            self.go_on.wait(10)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "race_target:offload"})
def test_no_patch_lands_after_uninstall_returns(tmp_path: Path) -> None:
    """Scenario 9: a target imported on another thread while uninstall() runs is either patched
    and then restored, or never patched; once uninstall() has returned, nothing is wrapped.

    The other thread is stopped after its import finished and before the patch is made: at the
    first import of wrapt, which the patcher needs."""
    assert "wrapt" not in sys.modules, "this test needs wrapt to be imported by the patch itself"
    write_module(tmp_path, "race_target", "def offload(models):\n    return 'offloaded'\n")
    import te_offload_shim

    pausing = _PausingFinder("wrapt")
    sys.meta_path.insert(0, pausing)
    thread = threading.Thread(target=importlib.import_module, args=("race_target",))
    thread.start()
    assert pausing.inside.wait(10), "the patch did not start"
    te_offload_shim.uninstall()
    returned = sys.modules["race_target"].offload
    pausing.go_on.set()
    thread.join(10)
    from te_offload_shim.engine.patch import shim_layers

    target = sys.modules["race_target"]
    assert shim_layers(returned) == 0 and shim_layers(target.offload) == 0, "a patch landed after uninstall()"
    layer = cached_layer()
    target.offload([layer])
    assert layer._fp8_workspaces, "and nothing clears"
