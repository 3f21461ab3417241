"""Never harming, for the flush net's surface: `torch.cuda.empty_cache` called from many threads at
once, from a signal handler, in a forked child, during interpreter shutdown, before CUDA is
initialised, from `torch.compile` and `torch.jit.script` callers, and with an application's own
wrapper around it (profilers wrap it). Each keeps the flush's own behaviour (return value,
exceptions) untouched.

Each test runs in a fresh interpreter on TE's own layers (TE 2.20.2 on the CPU twin, the table's
rows out of play) unless it says otherwise. The flush the net wraps is, in most of them, a
recorder put in place before TE is imported: it returns a token of its own, so that a test sees
that the net hands back what the flush returned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NO_TABLE = {"TE_OFFLOAD_SHIM_DISABLE": "*"}
REPO = Path(__file__).resolve().parents[2]


def _cuda() -> Any:
    """`torch.cuda`, untyped: the flushes under test return what they wrap (a recorder's token), not
    the None torch's stubs declare."""
    import torch

    return torch.cuda


class Flushed(Exception):
    pass


def _recording_flush() -> list[int]:
    """Put a flush that counts its calls and returns "flushed" in torch.cuda's place (before TE is
    imported, so it is what the net wraps)."""
    import torch
    from support import net_case

    net_case.install_device()
    calls: list[int] = []

    def empty_cache() -> str:
        calls.append(1)
        return "flushed"

    torch.cuda.empty_cache = empty_cache  # type: ignore[assignment]
    return calls


def _offloaded(te: Any, seed: int = 0) -> Any:
    from support import net_case

    layer = net_case.cached_linear(te, seed)
    net_case.offload_like_megatron(layer)
    return layer


@pytest.mark.subprocess(env=NO_TABLE)
def test_many_threads_flushing_at_once_while_layers_are_built() -> None:
    import threading

    import torch
    from support import net_case

    import te_offload_shim

    calls = _recording_flush()
    te = net_case.load()
    results: list[object] = []
    errors: list[BaseException] = []
    start = threading.Barrier(9)

    def flush() -> None:
        start.wait()
        try:
            for _ in range(40):
                results.append(_cuda().empty_cache())
        except BaseException as exc:
            errors.append(exc)

    # TE layers are built on the main thread (the twin's device redirect is a per-thread mode); the
    # other thread offloads them one by one while eight threads flush
    built = [net_case.cached_linear(te, seed) for seed in range(6)]

    def build() -> None:
        start.wait()
        for layer in built:
            net_case.offload_like_megatron(layer)

    threads = [threading.Thread(target=flush) for _ in range(8)] + [threading.Thread(target=build)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert results == ["flushed"] * 320 and len(calls) == 320
    torch.cuda.empty_cache()
    assert [net_case.entries(layer) for layer in built] == [0] * 6
    net = te_offload_shim.stats()["net"]
    assert net["flushes"] == 321 and net["entries"] == 6 and net["errors"] == 0


@pytest.mark.subprocess(env=NO_TABLE, timeout=120)
def test_a_signal_handler_that_flushes_while_the_net_is_clearing() -> None:
    import signal

    from support import net_case

    import te_offload_shim

    calls = _recording_flush()
    te = net_case.load()
    from_handler: list[object] = []

    def on_alarm(signum: int, frame: Any) -> None:
        from_handler.append(_cuda().empty_cache())

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    try:
        layers = []
        for seed in range(40):  # every flush of the loop clears: the main thread is inside the net often
            layers.append(_offloaded(te, seed))
            assert _cuda().empty_cache() == "flushed"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
    assert from_handler and set(from_handler) == {"flushed"}, "the handler's flushes ran, and returned torch's value"
    assert len(calls) == 40 + len(from_handler)
    assert all(net_case.entries(layer) == 0 for layer in layers)
    assert te_offload_shim.stats()["net"]["errors"] == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def _forked_child_offloads_and_clears(fresh: Any, timeout: float) -> int | None:
    """Fork; the child (only this thread lives on there, whatever the others held reset) offloads
    `fresh` as megatron-core does and flushes: its exit status, 0 when the flush cleared the cache."""
    from hostile_util import child_exit_status
    from support import net_case

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            net_case.offload_like_megatron(fresh)
            code = 0 if _cuda().empty_cache() == "flushed" and net_case.entries(fresh) == 0 else 2
        finally:
            os._exit(code)
    return child_exit_status(pid, timeout)


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_child_forked_while_another_thread_flushes_can_flush_and_clear() -> None:
    import threading

    import torch
    from hostile_util import held_by_another_thread
    from support import net_case

    import te_offload_shim  # noqa: F401

    calls = _recording_flush()
    te = net_case.load()
    stop = threading.Event()

    def flush_all_the_time() -> None:
        while not stop.is_set():
            torch.cuda.empty_cache()

    layers = [_offloaded(te, seed) for seed in range(3)]
    flusher = threading.Thread(target=flush_all_the_time)
    flusher.start()
    try:
        for _ in range(5):
            assert _forked_child_offloads_and_clears(net_case.cached_linear(te, 9), 60) == 0
    finally:
        stop.set()
        flusher.join(30)
    assert calls and all(net_case.entries(layer) == 0 for layer in layers)

    # the worst moment, made certain: a thread holds the lock the net counts under at the fork
    from te_offload_shim.engine import stats

    with held_by_another_thread(stats._lock):
        status = _forked_child_offloads_and_clears(net_case.cached_linear(te, 11), 30)
        assert status == 0, "the child flushed and cleared with the lock held at the fork"


SHUTDOWN = """
import atexit, sys, torch
from support import net_case
import te_offload_shim

te = net_case.load()
layer = net_case.cached_linear(te)
net_case.offload_like_megatron(layer)

class FlushAtTeardown:
    def __del__(self, flush=torch.cuda.empty_cache):  # the net's wrapper, called after modules are torn down
        print("teardown", flush(), flush=True)

keep = FlushAtTeardown()  # flushed while the interpreter tears its modules down
atexit.register(lambda: print("atexit", torch.cuda.empty_cache(), net_case.entries(layer), flush=True))
"""


@pytest.mark.subprocess(env=NO_TABLE)
def test_flushes_during_interpreter_shutdown() -> None:
    from conftest import child_env

    env = child_env(NO_TABLE, path=[REPO / "tests"])
    done = subprocess.run([sys.executable, "-c", SHUTDOWN], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "atexit None 0" in done.stdout, "the net cleared at the atexit flush, which returned torch's value"
    assert "teardown None" in done.stdout, "a flush at module teardown returned torch's value"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.subprocess(env=NO_TABLE)
def test_before_cuda_is_initialised_the_flush_is_torchs_no_op() -> None:
    """Real torch, no twin: TE's classes from its wheel (harness/te_import.py). On this CPU build
    torch's own flush does nothing while CUDA is not initialised; wrapped, it still does nothing,
    and the net initialises nothing."""
    import torch

    from harness import te_import

    def direct(x: torch.Tensor) -> torch.Tensor:
        torch.cuda.empty_cache()
        return x + 1

    torch_flush = torch.cuda.empty_cache
    with pytest.raises(RuntimeError):  # TorchScript cannot compile torch's flush...
        torch.jit.script(direct)
    import te_offload_shim

    te_import.load("2.20.2")
    assert _cuda().empty_cache is not torch_flush and _cuda().empty_cache.__wrapped__ is torch_flush
    with pytest.raises(RuntimeError):  # ... nor the net's wrapper around it: the same error type
        torch.jit.script(direct)
    assert not torch.cuda.is_initialized()
    assert _cuda().empty_cache() is None and _cuda().memory.empty_cache() is None
    assert not torch.cuda.is_initialized(), "the net does not initialise CUDA"
    assert te_offload_shim.stats()["net"]["flushes"] == 2 and te_offload_shim.stats()["net"]["errors"] == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_compiled_and_scripted_callers() -> None:
    """A `torch.compile`d caller runs the net at every call (after an offload that happened since it
    was compiled too); a TorchScript caller reaches the flush through `torch.jit.ignore` (one that
    calls it directly cannot be scripted, net or not: test_before_cuda_is_initialised...)."""
    import torch
    from support import net_case

    import te_offload_shim  # noqa: F401

    te = net_case.load()

    def caller(x: torch.Tensor) -> torch.Tensor:
        torch.cuda.empty_cache()
        return x * 2

    compiled = torch.compile(caller, backend="eager")
    assert torch.equal(compiled(torch.ones(2)), caller(torch.ones(2)))
    layer = _offloaded(te)
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    assert net_case.entries(layer) == 0, "the compiled caller's flush ran the net"

    # unannotated (this module's annotations are strings TorchScript cannot read): Tensor -> Tensor
    @torch.jit.ignore
    def flush(x):  # type: ignore[no-untyped-def]
        torch.cuda.empty_cache()
        return x

    @torch.jit.script
    def scripted(x: torch.Tensor) -> torch.Tensor:
        return flush(x) + 1

    other = _offloaded(te, 3)
    assert torch.equal(scripted(torch.ones(1)), torch.full((1,), 2.0))
    assert net_case.entries(other) == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_profilers_wrapper_before_and_after_the_net() -> None:
    import functools

    import torch
    from support import net_case

    import te_offload_shim

    calls = _recording_flush()
    seen: list[str] = []

    def profile(flush: Any, name: str) -> Any:
        @functools.wraps(flush)
        def profiled(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return flush(*args, **kwargs)

        return profiled

    torch.cuda.empty_cache = before = profile(torch.cuda.empty_cache, "before")  # type: ignore[assignment]
    te = net_case.load()
    assert _cuda().empty_cache.__wrapped__ is before, "the net wraps what it found: the profiler's"
    torch.cuda.empty_cache = after = profile(torch.cuda.empty_cache, "after")  # type: ignore[assignment]
    layer = _offloaded(te)
    assert _cuda().empty_cache() == "flushed" and seen == ["after", "before"] and net_case.entries(layer) == 0

    flushes = te_offload_shim.stats()["net"]["flushes"]
    te_offload_shim.uninstall()
    assert torch.cuda.empty_cache is after, "the profiler that wrapped us stays; our wrapper inside it is disarmed"
    again = _offloaded(te, 1)
    assert torch.cuda.empty_cache() == "flushed" and net_case.entries(again) == 1
    assert seen == ["after", "before"] * 2 and len(calls) == 2
    assert te_offload_shim.stats()["net"]["flushes"] == flushes, "the disarmed wrapper did not even look"


@pytest.mark.parametrize("shape", ["global", "closure", "attribute"])
@pytest.mark.subprocess(env=NO_TABLE)
def test_a_tracker_that_wrapped_the_flush_before_te_one_flush_is_one_check_and_uninstall_puts_it_back(
    shape: str,
) -> None:
    """A memory tracker wrapped `torch.cuda.empty_cache` before TE's import, holding torch's own
    `torch.cuda.memory.empty_cache` (which the net wraps apart, and whose aliases it rebinds) in a
    module global, a closure, or by torch's attribute: whichever name is called, one flush is one
    check and one count, the layer offloaded is cleared, the tracker runs once; `uninstall()` puts
    back the tracker, torch's function and the tracker's global."""
    import torch
    from support import memory_tracker, net_case

    import te_offload_shim

    net_case.install_device()
    torch_flush = torch.cuda.memory.empty_cache
    tracked = memory_tracker.install(shape)
    te = net_case.load()
    assert torch.cuda.empty_cache is not tracked and torch.cuda.memory.empty_cache is not torch_flush, "both wrapped"
    for flush in ("torch.cuda", "torch.cuda.memory", "torch.cuda", "torch.cuda.memory"):
        layer = _offloaded(te)
        flushes, trackings = te_offload_shim.stats()["net"]["flushes"], len(memory_tracker.calls)
        (torch.cuda if flush == "torch.cuda" else torch.cuda.memory).empty_cache()
        net = te_offload_shim.stats()["net"]
        assert net["flushes"] == flushes + 1, f"{flush}.empty_cache(): {net['flushes'] - flushes} checks"
        assert net_case.entries(layer) == 0
        assert len(memory_tracker.calls) == trackings + (flush == "torch.cuda"), memory_tracker.calls
    assert te_offload_shim.stats()["net"]["cleared_flushes"] == 4

    te_offload_shim.uninstall()
    assert torch.cuda.empty_cache is tracked and torch.cuda.memory.empty_cache is torch_flush
    assert memory_tracker._saved is (torch_flush if shape == "global" else None)
    assert vars(memory_tracker)["_tracked_global"].__module__ == "support.memory_tracker"
    assert not hasattr(vars(memory_tracker)["_tracked_global"], "__wrapped__")


@pytest.mark.subprocess(env=NO_TABLE)
def test_the_flushs_own_exception_goes_through_untouched() -> None:
    import traceback

    import torch
    from support import net_case

    import te_offload_shim  # noqa: F401

    net_case.install_device()
    raised = Flushed("the driver said no")

    def empty_cache() -> None:
        raise raised

    torch.cuda.empty_cache = empty_cache  # type: ignore[assignment]
    te = net_case.load()
    layer = _offloaded(te)
    with pytest.raises(Flushed) as caught:
        torch.cuda.empty_cache()
    assert caught.value is raised and net_case.entries(layer) == 0, "cleared first, then the flush raised"
    assert traceback.extract_tb(caught.tb)[-1].name == "empty_cache"
