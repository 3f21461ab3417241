"""Faults, bad input and concurrency: the shim never breaks the program it runs in.

Hooks that fail never fail the import; clearing that fails never stops the offload; the wrapped
function keeps its own behaviour and errors exactly; installing from many threads at once, or while
a target is being imported, leaves exactly one wrapper.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from support.verl_case import ENGINE, build, offload

TARGETS = (
    "faulty:missing,faulty:CONST,faulty:weird,faulty:fine,faulty:Engine.offload@self.model,faulty:Nope.method,"
    "faulty:other@modelz"
)


def use_faulty() -> None:
    """Put tests/hostile/targets (where `faulty` lives) on the path."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile" / "targets"))


def strict_or_not(**env: str) -> list[Any]:
    """Both modes, each in a fresh interpreter with `env` and TE_OFFLOAD_SHIM_STRICT set."""
    return [
        pytest.param(strict, marks=pytest.mark.subprocess(env={**env, "TE_OFFLOAD_SHIM_STRICT": strict}))
        for strict in ("0", "1")
    ]


@pytest.mark.parametrize("strict", strict_or_not(TE_OFFLOAD_SHIM_TARGETS=TARGETS))
def test_hooks_that_cannot_patch_never_fail_the_import(strict: str, caplog: pytest.LogCaptureFixture) -> None:
    """Strict mode raises at call time, never inside an import."""
    caplog.set_level(logging.INFO)
    import te_offload_shim

    use_faulty()
    import faulty

    from te_offload_shim.engine.patch import shim_layers

    st = te_offload_shim.status()
    # An error is the state "error" with its reason in "detail"; written together here, as the log says it.
    states = {
        r["name"]: r["state"] + (f": {r['detail']}" if r["detail"] else "")
        for r in st["targets"]
        if r["name"].startswith("faulty")
    }
    assert states["faulty:missing"] == "absent"
    assert states["faulty:Nope.method"] == "absent"
    assert states["faulty:CONST"].startswith("error: CONST is a int")
    assert states["faulty:fine"] == "patched" and shim_layers(faulty.fine) == 1
    assert states["faulty:other"].startswith("error: models spec 'modelz' names no parameter of other")
    assert faulty.weird("m") == "called", "an unpatchable attribute is left exactly as it was"
    # A target whose patching raises is an error state of its own, said once, never a hook error.
    assert states["faulty:weird"] == "error: RuntimeError: no signature for you"
    assert st["hook_errors"] == []
    assert caplog.text.count("faulty:weird is not patched (error: RuntimeError: no signature for you)") == 1
    assert caplog.text.count("is not patched") == 5, "weird, CONST, other, and the two absent user targets"
    assert faulty.fine("m") == "fine"


@pytest.mark.parametrize("strict", strict_or_not(TE_OFFLOAD_SHIM_TARGETS=TARGETS))
def test_locating_models_that_raises_fails_open_and_raises_in_strict(
    strict: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim

    use_faulty()
    import faulty

    results = []
    for _ in range(3):
        try:
            results.append(faulty.Engine().offload())
        except RuntimeError as exc:
            results.append("raised: " + str(exc))
    if strict == "1":
        assert results == ["raised: model property exploded"] * 3
        return
    assert results == ["offloaded"] * 3
    assert caplog.text.count("model property exploded") == 1, "one warning, not one per call"
    assert te_offload_shim.stats()["errors"] == 3


def not_a_dict(model: Any) -> None:
    from harness import megatron_world as w

    layers = w.linear_layers(model)
    layers[0][1].__dict__["_fp8_workspaces"] = ["a list", "not a dict"]
    layers[1][1].__dict__["_fp8_workspaces"] = ("a tuple",)


@pytest.mark.subprocess(verl="0.8.0")
def test_non_dict_workspaces_skipped_with_one_warning_and_weights_round_trip(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim  # noqa: F401

    r = offload(build(not_a_dict), ENGINE)
    assert r["offloaded"] and r["same"]
    assert r["after"] == {"entries": 0, "bytes": 0} and r["stats"]["entries"] == 7
    assert caplog.text.count("not a dict") == 1


@pytest.mark.subprocess(verl="0.8.0")
def test_bad_input_behaves_exactly_as_the_original(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    import torch

    from harness import megatron_world as w
    from harness import te_standins as te

    w.apply_cpu_quirks()
    import verl.utils.megatron_utils as mu

    import te_offload_shim

    wrapped = mu.offload_megatron_model_to_cpu
    original = wrapped.__wrapped__

    def plain() -> Any:
        layer = te.TELinearStandIn(8, 8)
        te.fill_like_forward(layer)
        return torch.nn.Sequential(layer, torch.nn.ReLU())

    def no_te() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(4, 4))

    inputs = {
        "none": lambda: None,
        "empty list": lambda: [],
        "generator": lambda: (m for m in [plain()]),
        "single module": lambda: plain()[0],
        "an iterable module": plain,
        "single DDP": lambda: w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32)),
        "no TE layers": lambda: [no_te()],
        "an int": lambda: 7,
    }

    def outcome(fn: Any, value: Any) -> list[str]:
        try:
            return ["returned", repr(fn(value))]
        except Exception as exc:
            return [type(exc).__name__, str(exc)]

    out = {
        n: {"original": outcome(original, make()), "wrapped": outcome(wrapped, make())} for n, make in inputs.items()
    }
    for name, pair in out.items():
        assert pair["wrapped"] == pair["original"], name
    assert out["none"]["original"][0] == "TypeError"
    assert out["single module"]["original"][0] == "TypeError"
    assert out["generator"]["original"] == ["returned", "None"]
    assert caplog.text.count("one-shot iterator") == 1
    assert te_offload_shim.stats()["errors"] == 0, caplog.text[-2000:]


RACES = 40
RACE_TARGETS = {"TE_OFFLOAD_SHIM_TARGETS": ",".join(f"race_{i}:offload" for i in range(RACES))}


# fresh: each patch and each uninstall rebinds aliases across every loaded module, and the 40 rounds
# patch again every target imported so far; with the fork server's transformers loaded (2,700
# modules, 34 ms a scan) that took 55 s, against 11 s in a new interpreter.
@pytest.mark.subprocess(env=RACE_TARGETS, fresh=True)
def test_concurrent_install_and_import_leave_exactly_one_wrapper(tmp_path: Path) -> None:
    import importlib
    import threading
    import time

    # Many fresh modules, each a target, each with a module that from-imports it (an alias to rebind).
    for i in range(RACES):
        (tmp_path / f"holder_{i}.py").write_text(f"from race_{i} import offload\n")
        (tmp_path / f"race_{i}.py").write_text(
            f"def offload(models):\n    return models\n\nimport holder_{i} as alias_holder\n"
        )
        (tmp_path / f"next_{i}.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    te_offload_shim.uninstall()

    # 8 threads call install() at once
    barrier = threading.Barrier(8)

    def go() -> None:
        barrier.wait()
        te_offload_shim.install()

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shim_layers(importlib.import_module("race_0").offload) == 1

    # a target imported on one thread while another installs, with the two racing in both orders
    races = []
    for i in range(1, RACES):
        te_offload_shim.uninstall()
        pair_barrier = threading.Barrier(2)

        def importer(i: int = i, pair_barrier: threading.Barrier = pair_barrier) -> None:
            pair_barrier.wait()
            time.sleep((i % 3) * 0.0005)
            importlib.import_module(f"race_{i}")

        def installer(i: int = i, pair_barrier: threading.Barrier = pair_barrier) -> None:
            pair_barrier.wait()
            time.sleep(((i + 1) % 3) * 0.0005)
            te_offload_shim.install()

        pair = [threading.Thread(target=importer), threading.Thread(target=installer)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        # an import already running when install() ran is patched at the end of the next import
        importlib.import_module(f"next_{i}")
        mod = sys.modules[f"race_{i}"]
        races.append([shim_layers(mod.offload), shim_layers(mod.alias_holder.offload)])
    assert races == [[1, 1]] * (RACES - 1)


def test_a_buffer_no_ddp_holds_is_searched_for_once(monkeypatch) -> None:
    """A user's own buffer: one gc scan, not one per offload; the search that finds nothing says so
    (it raises, once: the handler logs it once and `status` shows it), the later offloads do not."""
    from te_offload_shim.integrations import megatron_ddp as megatron_buffers

    scans = []
    monkeypatch.setattr(megatron_buffers, "_scan", lambda: scans.append(1))

    class Buffer:
        params = ()

    orphan = Buffer()
    with pytest.raises(megatron_buffers.OwnerNotFound, match="no megatron DistributedDataParallel"):
        megatron_buffers.modules_of_buffer(orphan)
    assert megatron_buffers.modules_of_buffer(orphan) == (None, [])
    assert len(scans) == 1
    with pytest.raises(megatron_buffers.OwnerNotFound):
        megatron_buffers.modules_of_buffer(Buffer())
    assert len(scans) == 2


def test_disabling_a_framework_covers_its_variants(monkeypatch) -> None:
    from te_offload_shim import _switches as _config

    monkeypatch.setenv("TE_OFFLOAD_SHIM_DISABLE", "nemo-rl, areal")
    off = [
        n
        for n in ("nemo-rl", "nemo-rl-0.5", "nemo-rl-0.3", "areal", "areal-awex", "roll", "verl")
        if _config.is_disabled(n)
    ]
    assert off == ["nemo-rl", "nemo-rl-0.5", "nemo-rl-0.3", "areal", "areal-awex"]


def test_ray_tracing_keyword_does_not_stop_the_clearing() -> None:
    """Ray's tracing closure passes `_ray_trace_ctx` to actor methods; the original's signature has
    no such parameter, so binding must look past it."""
    import inspect

    import torch

    from harness import te_standins as te
    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations import ray  # noqa: F401  (declares the keyword to the engine)
    from te_offload_shim.integrations.targets import Target

    class Actor:
        def __init__(self) -> None:
            layer = te.TELinearStandIn(4, 4)
            te.fill_like_forward(layer)
            self.model = torch.nn.Sequential(layer)

        def sleep(self) -> str:
            return "slept"

    target = Target("tracing", __name__, "Actor.sleep", "self.model")
    record = Record("target", Actor, "sleep", Actor.sleep, target=target.name)
    handler = Handler(target, inspect.signature(Actor.sleep), "method", record)
    actor = Actor()
    seen: list[dict[str, Any]] = []

    def original(**kw: Any) -> str:
        seen.append(kw)
        return "slept"

    result = handler(original, actor, (), {"_ray_trace_ctx": {"t": 1}})
    assert result == "slept" and seen == [{"_ray_trace_ctx": {"t": 1}}], "the original still gets the keyword"
    assert actor.model[0]._fp8_workspaces == {}


def test_fail_open_hands_on_the_applications_exception_raises_in_strict_and_else_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """_log.fail_open, the rule each fail-open site follows: what the application's signal handler
    raised goes on to it, strict mode raises the shim's own error (the switch, or the caller's
    `strict`), else one warning per key."""
    import signal

    from te_offload_shim._log import describe_error, fail_open

    class Timeout(Exception):
        pass

    def on_signal(signum: int, frame: object) -> None:
        raise Timeout("the application's")

    old = signal.signal(signal.SIGUSR1, on_signal)
    try:
        try:
            signal.raise_signal(signal.SIGUSR1)
        except Timeout as exc:
            with pytest.raises(Timeout) as raised:
                fail_open(exc, "test-fail-open:signal", "te_offload_shim: %s", describe_error(exc), strict=False)
            assert raised.value is exc, "the very exception, even where the caller says not strict"
    finally:
        signal.signal(signal.SIGUSR1, old)
    own = RuntimeError("the shim's own")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_STRICT", "1")
    with pytest.raises(RuntimeError, match="the shim's own"):
        fail_open(own, "test-fail-open:own", "te_offload_shim: failed: %s", describe_error(own))
    caplog.set_level(logging.WARNING, logger="te_offload_shim")
    # the exception itself in the message's arguments: said as describe_error says it, not kept
    fail_open(own, "test-fail-open:own", "te_offload_shim: failed: %s", own, strict=False)
    monkeypatch.delenv("TE_OFFLOAD_SHIM_STRICT")
    with pytest.raises(RuntimeError, match="the shim's own"):
        fail_open(own, "test-fail-open:own", "te_offload_shim: failed: %s", describe_error(own), strict=True)
    fail_open(own, "test-fail-open:own", "te_offload_shim: failed: %s", describe_error(own))
    said = [r.getMessage() for r in caplog.records if "failed: RuntimeError" in r.getMessage()]
    # without the shim's prefix: caplog's format shows `%(name)s`, and the name is said once
    assert said == ["failed: RuntimeError: the shim's own"], said
    assert all(not isinstance(a, BaseException) for r in caplog.records for a in r.args or ())


def test_describe_error_never_raises_and_keeps_no_reference() -> None:
    """_log.describe_error: `Type: message` as a plain string; an exception whose `__str__` raises is
    named by its type (the fail-open sites describe what failed with it, inside `except`)."""
    import gc
    import weakref

    from te_offload_shim._log import describe_error

    class Odd(Exception):
        def __str__(self) -> str:
            raise ValueError("no str")

    odd = Odd()
    assert describe_error(RuntimeError("boom")) == "RuntimeError: boom"
    assert describe_error(odd) == "Odd"
    alive = weakref.ref(odd)
    text = describe_error(odd)
    del odd
    gc.collect()
    assert alive() is None and type(text) is str


class StepTimeout(Exception):
    """What an application's SIGALRM handler raises (a step timeout)."""


class AlarmedOffload:
    """A callable target whose signature, first read while it is patched, is where the application's
    alarm goes off (once)."""

    armed = True

    def __call__(self, models: Any) -> str:
        return "offloaded"

    @property
    def __signature__(self) -> Any:
        import signal

        if AlarmedOffload.armed:
            AlarmedOffload.armed = False
            signal.raise_signal(signal.SIGALRM)
        return None


ALARMED = AlarmedOffload()  # `alarmed_patch:ALARMED` below: the module is this test module's own


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "alarmed_patch:offload"})
def test_the_applications_timeout_raised_while_a_target_is_patched_reaches_it(tmp_path: Path) -> None:
    """The alarm goes off inside the patching itself: the application's exception goes on, into the
    import, as it would have from the module's last line; it is not taken for the shim's failure."""
    import signal
    from types import ModuleType

    import te_offload_shim

    def timeout(signum: int, frame: Any) -> None:
        raise StepTimeout("the step took too long")

    module = ModuleType("alarmed_patch")
    module.offload = ALARMED  # type: ignore[attr-defined]
    (tmp_path / "next_import_after_alarm.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    old = signal.signal(signal.SIGALRM, timeout)
    try:
        sys.modules["alarmed_patch"] = module
        with pytest.raises(StepTimeout, match="too long"):
            importlib.import_module("next_import_after_alarm")  # the process's next import: the module is due
    finally:
        signal.signal(signal.SIGALRM, old)
    rows = [r for r in te_offload_shim.status()["targets"] if r["name"] == "alarmed_patch:offload"]
    assert [r["state"] for r in rows] != ["error"], "the application's timeout was taken for the shim's failure"
