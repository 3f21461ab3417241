"""Clearing TE's caches between training steps, and between microbatches, on TE's own modules
(on the twin: TE's real Python, its compiled extension replaced by CPU kernels; tests/twin/conftest.py).

Runs are 3 optimizer steps x 2 microbatches (is_first_microbatch True then False), seeded, with
float32 and with bf16 parameters, inputs that need a gradient (so every backward runs the dgrad
GEMM, which reads the weight's column-wise copy); `Run.same` compares losses, input gradients,
each step's gradients and the final weights to the bit."""

from __future__ import annotations

from typing import Any

import pytest

from harness.te_twin.cells import (
    COPIES,
    DTYPES,
    FAMILY,
    MODULES,
    clear_between_steps,
    cleared_entries,
    copy_params,
    dtype_for,
    keep_run,
    need,
    recipe_sm_params,
)

pytestmark = pytest.mark.twin


def _rowwise_data(value: object) -> object:
    return getattr(value, "_data", None) if getattr(value, "_data", None) is not None else value._rowwise_data  # type: ignore[attr-defined]


def corrupt_in_place(t: Any) -> None:
    """A stale copy: FP8 / FP4 data zeroed; a scale-inverse or an amax doubled (float32), or its
    uint8 scales' bytes raised by one (MXFP8's E8M0 exponents: x2; NVFP4's E4M3 block scales: the
    next E4M3 value, 448 becoming NaN)."""
    import torch

    if t.dtype == torch.uint8:
        t.add_(1)
    else:
        t.mul_(2)


@pytest.mark.twin(every_release=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())
@pytest.mark.parametrize("module", MODULES)
def test_clearing_between_steps_is_bit_identical_to_keeping(
    release: str, module: str, recipe: str, sm: int, dtype: str
) -> None:
    """The shim's clear after every optimizer step (where an offload runs) changes no loss, no
    input gradient, no weight gradient, no weight; and it did clear something every time."""
    need(release, recipe, module)
    from harness.te_twin import training

    cleared_entries.clear()
    cleared = training.train(training.build(module, dtype=dtype), recipe, after_step=clear_between_steps)
    assert cleared_entries and all(n > 0 for n in cleared_entries), cleared_entries
    assert cleared.same(keep_run(module, recipe, dtype))


@pytest.mark.parametrize(("recipe", "sm", "copy"), copy_params())
@pytest.mark.parametrize("module", MODULES)
def test_negative_control_each_cached_copy_corrupted_where_te_reads_it_changes_the_result(
    release: str, module: str, recipe: str, sm: int, copy: str
) -> None:
    """The comparison above can fail, through every copy TE reads: each cached copy (row-wise and
    column-wise data, their scale-inverses; harness/te_twin/cells.py COPIES) is present in every
    cache entry before a forward(is_first_microbatch=False), which uses the cache as it is, and
    corrupting it there changes the result where TE reads it: a copy the forward GEMM reads changes
    that microbatch's loss; one only the dgrad GEMM reads leaves the loss alone and changes the
    input gradient."""
    need(release, recipe, module)
    import torch

    from harness.te_twin import training

    field, read_by = COPIES[FAMILY[recipe], sm][copy]
    dtype = dtype_for(recipe)

    def corrupt(model: object, step: int, microbatch: int) -> None:
        if microbatch == 1:
            entries = training.workspaces(model)  # type: ignore[arg-type]
            assert entries
            for key, value in entries.items():
                t = getattr(value, field, None)
                assert isinstance(t, torch.Tensor), f"{key} holds no {field}: the cache lacks a copy TE makes"
                t.zero_() if copy.endswith("data") else corrupt_in_place(t)

    keep = keep_run(module, recipe, dtype)
    corrupted = training.train(training.build(module, dtype=dtype), recipe, before_microbatch=corrupt)
    assert not corrupted.same(keep)
    # the first microbatch that reads the corrupted cache (step 0's second; later ones also see
    # weights the corrupted gradients updated)
    loss_changed = not torch.equal(corrupted.losses[1], keep.losses[1])
    dgrad_changed = not torch.equal(corrupted.input_grads[1], keep.input_grads[1])
    assert loss_changed == ("forward" in read_by), (copy, "the forward reads it" if loss_changed else "no loss moved")
    if "dgrad" in read_by:
        assert dgrad_changed, f"{copy}: the dgrad GEMM did not read it"


@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())
@pytest.mark.parametrize("module", MODULES)
def test_a_cache_corrupted_after_the_optimizer_step_is_requantized_in_place(
    release: str, module: str, recipe: str, sm: int
) -> None:
    """Why the negative control corrupts mid-step: after the optimizer step, the next
    forward(is_first_microbatch=True) re-quantizes the current weight into the cached object, so a
    corrupted (or stale) cache is overwritten before anything reads it."""
    need(release, recipe, module)
    from harness.te_twin import training

    def corrupt(model: object, step: int, microbatch: int) -> None:
        for value in training.workspaces(model).values():  # type: ignore[arg-type]
            _rowwise_data(value).zero_()  # type: ignore[attr-defined]

    dtype = dtype_for(recipe)
    corrupted = training.train(training.build(module, dtype=dtype), recipe, after_step=corrupt)
    assert corrupted.same(keep_run(module, recipe, dtype))


@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())
@pytest.mark.parametrize("module", MODULES)
def test_a_mid_step_clear_is_te_running_that_microbatch_without_its_weight_cache(
    release: str, module: str, recipe: str, sm: int
) -> None:
    """The shim's decision for an offload between microbatches: it clears. The result is exactly
    TE's own result for that microbatch with caching off (`is_first_microbatch=None`, the path of
    Megatron's `disable_parameter_transpose_cache`): the weight is quantized again with the scale
    of that moment. That equals keeping the cache for recipes whose scales come from the weight
    itself (current scaling, FP8 blocks, MXFP8, NVFP4), and differs from it under DelayedScaling, whose
    kept workspace carries the scale of the step's first microbatch (docs/te-twin.md gives the
    measured difference)."""
    need(release, recipe, module)
    from harness.te_twin import training

    def clear_mid_step(model: object, step: int, microbatch: int) -> None:
        if microbatch == 1:
            clear_between_steps(model, step, microbatch)

    dtype = dtype_for(recipe)
    cleared_entries.clear()
    mid = training.train(training.build(module, dtype=dtype), recipe, before_microbatch=clear_mid_step)
    assert cleared_entries and all(n > 0 for n in cleared_entries), cleared_entries
    uncached = training.train(
        training.build(module, dtype=dtype), recipe, first_microbatch=lambda step, mb: True if mb == 0 else None
    )
    assert mid.same(uncached)
    keep = keep_run(module, recipe, dtype)
    if recipe == "DelayedScaling":
        assert not mid.same(keep) and mid.max_loss_diff(keep) > 0
    else:
        assert mid.same(keep)
