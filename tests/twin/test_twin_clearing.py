"""Clearing TE's caches between training steps, and between microbatches, on TE's own modules
(on the twin: TE's real Python, its compiled extension replaced by CPU kernels; tests/twin/conftest.py).

Runs are 3 optimizer steps x 2 microbatches (is_first_microbatch True then False), float32,
seeded; `Run.same` compares losses, each step's gradients and the final weights to the bit."""

from __future__ import annotations

import pytest

from harness.te_twin.cells import MODULES, RECIPES, clear_between_steps, cleared_entries, keep_run, need

pytestmark = pytest.mark.twin


def _rowwise_data(value: object) -> object:
    return getattr(value, "_data", None) if getattr(value, "_data", None) is not None else value._rowwise_data  # type: ignore[attr-defined]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", MODULES)
def test_clearing_between_steps_is_bit_identical_to_keeping(release: str, module: str, recipe: str) -> None:
    """The shim's clear after every optimizer step (where an offload runs) changes no loss, no
    gradient, no weight; and it did clear something every time."""
    need(release, recipe, module)
    from harness.te_twin import training

    cleared_entries.clear()
    cleared = training.train(training.build(module), recipe, after_step=clear_between_steps)
    assert cleared_entries and all(n > 0 for n in cleared_entries), cleared_entries
    assert cleared.same(keep_run(module, recipe))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", MODULES)
def test_negative_control_a_cache_corrupted_where_te_reads_it_changes_the_result(
    release: str, module: str, recipe: str
) -> None:
    """The comparison above can fail: zeroing the cached FP8 data right before a
    forward(is_first_microbatch=False), which reads the cache as it is, changes the losses."""
    need(release, recipe, module)
    from harness.te_twin import training

    def corrupt(model: object, step: int, microbatch: int) -> None:
        if microbatch == 1:
            entries = training.workspaces(model)  # type: ignore[arg-type]
            assert entries
            for value in entries.values():
                _rowwise_data(value).zero_()  # type: ignore[attr-defined]

    corrupted = training.train(training.build(module), recipe, before_microbatch=corrupt)
    assert not corrupted.same(keep_run(module, recipe))
    assert corrupted.max_loss_diff(keep_run(module, recipe)) > 0


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", MODULES)
def test_a_cache_corrupted_after_the_optimizer_step_is_requantized_in_place(
    release: str, module: str, recipe: str
) -> None:
    """Why the negative control corrupts mid-step: after the optimizer step, the next
    forward(is_first_microbatch=True) re-quantizes the current weight into the cached object, so a
    corrupted (or stale) cache is overwritten before anything reads it."""
    need(release, recipe, module)
    from harness.te_twin import training

    def corrupt(model: object, step: int, microbatch: int) -> None:
        for value in training.workspaces(model).values():  # type: ignore[arg-type]
            _rowwise_data(value).zero_()  # type: ignore[attr-defined]

    assert training.train(training.build(module), recipe, after_step=corrupt).same(keep_run(module, recipe))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", MODULES)
def test_a_mid_step_clear_is_te_running_that_microbatch_without_its_weight_cache(
    release: str, module: str, recipe: str
) -> None:
    """The shim's decision for an offload between microbatches: it clears. The result is exactly
    TE's own result for that microbatch with caching off (`is_first_microbatch=None`, the path of
    Megatron's `disable_parameter_transpose_cache`): the weight is quantized again with the scale
    of that moment. That equals keeping the cache for recipes whose scales come from the weight
    itself (current scaling, FP8 blocks, MXFP8), and differs from it under DelayedScaling, whose
    kept workspace carries the scale of the step's first microbatch (docs/te-twin.md gives the
    measured difference)."""
    need(release, recipe, module)
    from harness.te_twin import training

    def clear_mid_step(model: object, step: int, microbatch: int) -> None:
        if microbatch == 1:
            clear_between_steps(model, step, microbatch)

    cleared_entries.clear()
    mid = training.train(training.build(module), recipe, before_microbatch=clear_mid_step)
    assert cleared_entries and all(n > 0 for n in cleared_entries), cleared_entries
    uncached = training.train(
        training.build(module), recipe, first_microbatch=lambda step, mb: True if mb == 0 else None
    )
    assert mid.same(uncached)
    keep = keep_run(module, recipe)
    if recipe == "DelayedScaling":
        assert not mid.same(keep) and mid.max_loss_diff(keep) > 0
    else:
        assert mid.same(keep)
