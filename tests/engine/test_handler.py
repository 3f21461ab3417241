"""What one wrapped offload call says (engine/handler.py): the clearing's line, word for word.

Each test runs in a fresh interpreter with one user target (`shim_targets:offload`, a plain
function) on a TE-layout stand-in layer; the allocator's counters are the CPU build's (CUDA never
initialised) unless a test stands a device in for them, as tests/hostile/test_measurement_failures.py does.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

TARGET = {"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"}


def use_targets() -> None:
    """Put the hostile tests' target modules (`shim_targets`) on the path."""
    import sys
    from pathlib import Path

    targets = str(Path(__file__).resolve().parents[1] / "hostile" / "targets")
    if targets not in sys.path:
        sys.path.insert(0, targets)


def cached_layer() -> Any:
    """A TE-layout linear (TE >= 1.8) whose `_fp8_workspaces` holds an entry, as after a forward."""
    from harness import te_standins as te

    layer = te.TELinearStandIn(8, 8)
    te.fill_like_forward(layer)
    return layer


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "before the flush" in r.getMessage()]


@pytest.mark.subprocess(env=TARGET)
def test_the_clearing_line_says_what_was_held_and_what_the_allocator_released_where_it_knows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import torch

    import te_offload_shim as shim
    from te_offload_shim._log import human_bytes

    use_targets()
    import shim_targets  # type: ignore[import-not-found]

    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    assert shim_targets.offload([cached_layer()]) == "offloaded"
    held = shim.stats()["bytes"]
    assert held > 0
    # CUDA not initialised: nothing measured, so nothing said of what was released
    first = (
        "shim_targets:offload: cleared 1 FP8 weight workspaces in 1 modules "
        f"({human_bytes(held)} held) before the flush"
    )
    assert _lines(caplog) == [(logging.INFO, first)], "the first line, at INFO where INFO is logged"

    allocated = iter([5 * 1024, 2 * 1024])  # before and after the clearing: 3 KiB handed back
    torch.cuda.is_initialized = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_allocated = lambda device=None: next(allocated)  # type: ignore[assignment,misc]
    assert shim_targets.offload([cached_layer()]) == "offloaded"
    second = (
        f"shim_targets:offload: cleared 1 FP8 weight workspaces in 1 modules "
        f"({human_bytes(shim.stats()['bytes'] - held)} held, 3.00 KiB released) before the flush"
    )
    assert _lines(caplog) == [(logging.INFO, first), (logging.DEBUG, second)]


def _handler(name: str, offload: Any, where: str = "models", **rules: Any) -> Any:
    """A handler made as the patcher makes one, for `offload` (a plain function), in this process."""
    import inspect

    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.engine.schema import Target

    target = Target(name, __name__, offload.__name__, where, **rules)
    return Handler(target, inspect.signature(offload), "function", Record("target", None, "offload", offload))


def test_a_call_left_alone_inside_another_wrapped_call_is_not_counted() -> None:
    """The outer call is what counts (`_left_alone`'s `nested`): an inner target's skip rule
    leaves its call alone uncounted, and the outer call's clearing is counted once."""
    import torch

    from te_offload_shim.engine import stats

    def inner_offload(models: list, weights: bool = True) -> str:
        return "inner"

    inner = _handler("inner", inner_offload, skip=lambda call: None if call["weights"] else "weights=False")

    def outer_offload(models: list) -> str:
        return inner(inner_offload, None, (models,), {"weights": False})

    outer = _handler("outer", outer_offload)
    stats.reset()
    try:
        assert outer(outer_offload, None, ([torch.nn.Sequential(cached_layer())],), {}) == "inner"
        counted = stats.counts()
    finally:
        stats.reset()
    assert counted["left_alone"] == {}, "the inner call, left alone inside the outer one, is not counted"
    assert counted["by_target"]["outer"]["calls"] == 1 and counted["entries"] == 1, counted


def test_each_target_whose_spec_finds_a_built_in_to_call_is_warned_about_and_inside_another_call_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A spec's final call that finds a built-in (`list.clear`) is refused: each target says so once
    (its own warning: one target's never hides another's), and a refused call inside another
    wrapped call is not counted, as any call left alone there."""
    import uuid

    import torch

    from te_offload_shim.engine import stats

    def offload(models: list) -> str:
        return "offloaded"

    run = uuid.uuid4().hex[:8]  # the warnings are once per process: names of this run's own
    first, second = (_handler(f"refused-{run}-{n}", offload, "models.clear()") for n in (1, 2))

    def outer_offload(models: list) -> str:
        return first(offload, None, (models,), {})

    outer = _handler(f"outer-{run}", outer_offload)
    layer = cached_layer()
    stats.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
            for handler in (first, second):
                assert handler(offload, None, ([layer],), {}) == "offloaded"
            said = [r.getMessage() for r in caplog.records if "not called" in r.getMessage()]
            stats.reset()
            assert outer(outer_offload, None, ([torch.nn.Sequential(layer)],), {}) == "offloaded"
            counted = stats.counts()
    finally:
        stats.reset()
    refused = f"{__name__}:offload: models spec 'models.clear()': clear is a builtin_function_or_method"
    assert len(said) == 2 and all(m.startswith(refused) for m in said), said
    assert f"refused-{run}-1" not in counted["left_alone"], "refused inside the outer call: not counted"
    assert counted["by_target"][f"outer-{run}"]["calls"] == 1, counted


def test_a_call_whose_models_hold_no_chunk_still_counts_as_a_call() -> None:
    """An offload handed an empty list is a call like any other: counted for its target (its last
    call's findings, nothing, replace the one before), though it frees nothing and says nothing."""
    from te_offload_shim.engine import stats

    def offload(models: list) -> str:
        return "offloaded"

    handler = _handler("empty", offload)
    stats.reset()
    try:
        assert handler(offload, None, ([],), {}) == "offloaded"
        counted = stats.counts()
    finally:
        stats.reset()
    assert (counted["calls"], counted["cleared_calls"]) == (1, 0), counted
    assert counted["by_target"]["empty"]["calls"] == 1, counted["by_target"]


def test_in_strict_mode_a_layer_the_clearing_cannot_read_raises_out_of_the_offload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Strict mode (`TE_OFFLOAD_SHIM_STRICT=1`, read at each call) reaches the clearing: a layer it
    cannot read raises `ShimError` out of the wrapped offload, once the other layers are cleared."""
    import torch

    from harness import te_standins as te
    from te_offload_shim.engine import stats
    from te_offload_shim.te.caches import ShimError

    Sealed = te.SealedLinearStandIn

    def offload(models: list) -> str:
        return "offloaded"

    handler = _handler("strict", offload)
    odd, healthy = Sealed(8, 8), cached_layer()
    te.fill_like_forward(odd)
    Sealed.sealed = True
    monkeypatch.setenv("TE_OFFLOAD_SHIM_STRICT", "1")
    stats.reset()
    try:
        with pytest.raises(ShimError, match="sealed module"):
            handler(offload, None, ([torch.nn.Sequential(odd, healthy)],), {})
    finally:
        stats.reset()
        Sealed.sealed = False
    assert healthy._fp8_workspaces == {} and odd._fp8_workspaces, "the healthy layer cleared first"


def test_a_clearing_limited_to_some_layers_leaves_the_rest_of_its_chunk_to_a_wrapper_inside_it() -> None:
    """A target whose clearing is limited to some parameters (megatron-core's buffer offload: one
    buffer's layers) covers no whole chunk: a wrapped offload inside it still clears the others."""
    import torch

    from te_offload_shim.engine import stats

    first, second = cached_layer(), cached_layer()
    chunk = torch.nn.Sequential(first, second)

    def inner_offload(models: list) -> str:
        return "inner"

    inner = _handler("whole", inner_offload)

    def buffer_offload(models: list) -> str:
        return inner(inner_offload, None, (models,), {})

    limited = _handler("limited", buffer_offload, resolve=lambda models: (models, list(first.parameters())))
    stats.reset()
    try:
        assert limited(buffer_offload, None, ([chunk],), {}) == "inner"
        counted = stats.counts()
    finally:
        stats.reset()
    assert first._fp8_workspaces == {} and second._fp8_workspaces == {}, "the inner wrapper cleared the rest"
    assert counted["by_target"]["whole"]["entries"] == 1, counted["by_target"]


def test_a_call_the_handler_steps_aside_from_reaches_the_original_whole() -> None:
    """Disarmed (after uninstall(), a wrapper put over ours keeps it) or at interpreter shutdown,
    the handler calls the original with every argument, keywords included, and clears nothing."""
    layer = cached_layer()

    def offload(models: list, *, tag: str = "default") -> str:
        return tag

    handler = _handler("aside", offload)
    assert handler(offload, None, ([layer],), {"tag": "at shutdown"}, _finalizing=lambda: True) == "at shutdown"
    handler.record.armed = False
    assert handler(offload, None, ([layer],), {"tag": "disarmed"}) == "disarmed"
    assert layer._fp8_workspaces, "nothing cleared"


def test_an_offload_reached_from_the_shims_own_clearing_runs_the_original_alone() -> None:
    """Code the clearing runs (here the spec's getter; a `__del__` the collector runs there is the
    same) that calls a patched offload finds the shim busy on its thread, holding no lock of the
    package: that offload runs the original alone, neither clearing nor counted."""
    import torch

    from te_offload_shim.engine import stats

    inner_ran = []

    def inner_offload(models: list, tag: str = "") -> str:
        inner_ran.append(models)
        return tag

    inner = _handler("reached", inner_offload)
    first, second = cached_layer(), cached_layer()

    class Holder:
        def get_models(self) -> list:
            assert inner(inner_offload, None, ([second],), {"tag": "inner"}) == "inner"
            return [torch.nn.Sequential(first)]

    def offload(holder: Holder) -> str:
        return "outer"

    outer = _handler("outer-busy", offload, "holder.get_models()")
    stats.reset()
    try:
        assert outer(offload, None, (Holder(),), {}) == "outer"
        counted = stats.counts()
    finally:
        stats.reset()
    assert inner_ran == [[second]] and second._fp8_workspaces, "the inner original ran alone, nothing cleared"
    assert first._fp8_workspaces == {} and "reached" not in counted["by_target"], counted["by_target"]


def test_under_the_audit_the_specs_getter_is_called_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit (`TE_OFFLOAD_SHIM_AUDIT`) is handed the chunks the clearing found: the spec's getter,
    the application's code, runs once per offload, not again for the audit."""
    import torch

    from te_offload_shim.engine import stats

    calls = []
    layer = cached_layer()

    class Holder:
        def get_models(self) -> list:
            calls.append(1)
            return [torch.nn.Sequential(layer)]

    def offload(holder: Holder) -> str:
        return "offloaded"

    handler = _handler("getter-audited", offload, "holder.get_models()")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", "cpu")
    stats.reset()
    try:
        assert handler(offload, None, (Holder(),), {}) == "offloaded"
        audited = stats.counts()["audit"]
    finally:
        stats.reset()
    assert audited is not None and audited["audits"] == 1, audited
    assert len(calls) == 1 and layer._fp8_workspaces == {}


def test_an_offload_reached_from_the_audits_report_runs_the_original_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's report, after the original returned, runs code of the application's (here a
    logging handler; a `__del__` the collector runs there is the same): a patched offload it calls
    runs the original alone, neither clearing nor counted."""
    import torch

    from te_offload_shim.engine import stats

    second = cached_layer()

    def inner_offload(models: list) -> str:
        return "inner"

    inner = _handler("reached-from-audit", inner_offload)

    class Offloading(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "audit after" in record.getMessage():
                assert inner(inner_offload, None, ([second],), {}) == "inner"

    def offload(models: list) -> str:
        return "outer"

    outer = _handler("audited", offload)
    logger = logging.getLogger("te_offload_shim")
    handler, level = Offloading(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", "cpu")
    stats.reset()
    try:
        assert outer(offload, None, ([torch.nn.Sequential(cached_layer())],), {}) == "outer"
        counted = stats.counts()
    finally:
        stats.reset()
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert counted["audit"] is not None and counted["audit"]["audits"] == 1, counted["audit"]
    assert second._fp8_workspaces and "reached-from-audit" not in counted["by_target"], counted["by_target"]


def test_what_the_handler_says_of_a_spec_or_a_clearing_that_fails_is_said_whole_once_per_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Word for word: a user's spec that finds nothing, a spec's call refused (a built-in), and a
    clearing that fails, each said once per target and kind (another target's, and a second kind
    of failure, are said too), and each failure counted for its target with the last one's
    `Type: message`."""
    import uuid

    from te_offload_shim.engine import stats

    run = uuid.uuid4().hex[:8]  # the warnings are once per process: names of this run's own
    errors = iter([RuntimeError("boom"), ValueError("bad value"), RuntimeError("boom again")])

    class Holder:
        def __init__(self) -> None:
            self.chunks: list = []

        def get_models(self) -> list:
            raise next(errors)

    def offload(holder: Holder) -> str:
        return "offloaded"

    missing, also_missing, refused, failing = (
        _handler(f"missing-{run}", offload, "holder.model"),
        _handler(f"also-missing-{run}", offload, "holder.models"),
        _handler(f"refused-{run}", offload, "holder.chunks.copy()"),
        _handler(f"failing-{run}", offload, "holder.get_models()"),
    )
    missing.target.user = also_missing.target.user = True  # a spec of the user's own must not stay silent
    stats.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
            for handler in (missing, missing, also_missing, refused, refused, failing, failing, failing):
                assert handler(offload, None, (Holder(),), {}) == "offloaded"
        left_alone = stats.counts()["left_alone"]
        failed = stats.snapshot().targets[f"failing-{run}"]  # what the target's status row says
    finally:
        stats.reset()
    path = f"{__name__}:offload"
    not_called = (
        "models spec 'holder.chunks.copy()': copy is a builtin_function_or_method, not a method written in "
        "Python (a built-in such as list.clear): not called, nothing cleared"
    )
    assert [r.getMessage() for r in caplog.records] == [  # the logger's name stands for the "te_offload_shim: "
        f"{path}: models spec 'holder.model' finds nothing (Holder has no attribute 'model'); "
        "nothing is cleared at this call",
        f"{path}: models spec 'holder.models' finds nothing (Holder has no attribute 'models'); "
        "nothing is cleared at this call",
        f"{path}: {not_called}",
        f"{path}: clearing FP8 caches failed (RuntimeError: boom); the offload goes on without it",
        f"{path}: clearing FP8 caches failed (ValueError: bad value); the offload goes on without it",
    ]
    assert left_alone == {f"refused-{run}": {not_called: 2}}, left_alone
    assert (failed.failed, failed.failed_why) == (3, "RuntimeError: boom again"), failed


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "aliased_offload:offload@models"})
def test_a_function_target_that_a_class_holds_as_a_method_is_read_as_the_call_it_gets(tmp_path: Any) -> None:
    """A patched module-level function that a class takes as an attribute after the patch (`offload
    = module.offload` in its body) is a method of that class: called on an instance, the function
    gets the instance first, and the shim reads the call so, finding the models where they are."""
    import sys

    import torch

    (tmp_path / "aliased_offload.py").write_text("def offload(worker, models):\n    return worker.name\n")
    sys.path.insert(0, str(tmp_path))
    import aliased_offload  # type: ignore[import-not-found]

    import te_offload_shim as shim

    class Worker:
        name = "worker"
        offload = aliased_offload.offload

    layer = cached_layer()
    assert Worker().offload([torch.nn.Sequential(layer)]) == "worker"
    assert layer._fp8_workspaces == {}, "cleared"
    assert shim.stats()["by_target"]["aliased_offload:offload"]["entries"] == 1


def test_the_spec_of_a_method_or_a_class_method_counts_the_arguments_after_self_or_cls() -> None:
    """`arg0` is the first argument after `self` for a method, after `cls` for a class method: wrapt
    hands over the instance (the class), and the handler reads the call as the function gets it."""
    import inspect

    import torch

    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.engine.schema import Target

    class Engine:
        def offload(self, models: list) -> str:
            return "method"

        @classmethod
        def class_offload(cls, models: list) -> str:
            return "class method"

    for binding, function, instance in (
        ("method", Engine.offload, Engine()),
        ("classmethod", vars(Engine)["class_offload"].__func__, Engine),
    ):
        target = Target(binding, __name__, f"Engine.{function.__name__}", "arg0")
        record = Record("target", Engine, function.__name__, function)
        handler = Handler(target, inspect.signature(function), binding, record)
        layer = cached_layer()
        bound = getattr(instance, function.__name__)
        assert handler(bound, instance, ([torch.nn.Sequential(layer)],), {}) == bound([])
        assert layer._fp8_workspaces == {}, f"the {binding}'s models found"


def test_a_keyword_a_framework_adds_is_passed_over_and_no_other_keyword_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyword a framework adds to every call (Ray's tracing context) is no argument of the
    function: the handler reads the call without it, models passed by keyword included. Any other
    keyword the function does not take makes the call one that does not bind: the original raises
    its own TypeError, and the shim clears nothing of it."""
    import torch

    from te_offload_shim.engine import attributes

    monkeypatch.setattr(attributes, "ignored_keywords", frozenset({"_ray_trace_ctx"}))

    def offload(models: list) -> str:
        return "offloaded"

    def traced(models: list, _ray_trace_ctx: Any = None) -> str:  # what the framework's wrapping calls
        return offload(models)

    handler = _handler("ray-keyword", offload)
    layer = cached_layer()
    call = {"models": [torch.nn.Sequential(layer)], "_ray_trace_ctx": {}}
    assert handler(traced, None, (), call) == "offloaded"
    assert layer._fp8_workspaces == {}, "cleared: the models were found by keyword"
    layer = cached_layer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'wrong'"):
        handler(traced, None, ([torch.nn.Sequential(layer)],), {"_ray_trace_ctx": {}, "wrong": 1})
    assert layer._fp8_workspaces, "a call that does not bind: nothing cleared"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:Engine.offload@arg0"})
def test_a_ray_actors_copy_of_a_method_is_read_as_the_method_is() -> None:
    """A `@ray.remote` class runs copies of its inherited methods (Ray's tracing closure); the
    handler the shim puts on such a copy reads the call as the method's own does: `arg0` is the
    first argument after `self` there too."""
    import torch
    from support.ray_copies import actor_class_with_a_traced_copy

    from te_offload_shim.integrations import ray as ray_actors

    use_targets()
    import shim_targets

    actor_class, _ = actor_class_with_a_traced_copy(shim_targets.Engine, "offload")
    assert ray_actors.patch_copies(actor_class) == 1
    layer = cached_layer()
    assert actor_class().offload([torch.nn.Sequential(layer)]) == "method"
    assert layer._fp8_workspaces == {}, "the copy's call found its models"
