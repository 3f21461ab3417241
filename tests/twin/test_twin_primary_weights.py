"""FP8 primary weights (`fp8_model_init` / `quantized_model_init`): TE keeps no workspace for them,
but the parameter carries its own column-wise copy (a Float8Tensor's `_transpose`). The shim drops
that transpose (through TE's own API for it: `clear_columnwise_cache`, `remove_caches` or
`update_usage`, as the release has) from TE 2.4, where every module rebuilds it when it is next
needed; these tests train a stack of two layers, so the second layer's backward runs the dgrad
GEMM that reads the transpose (the twin's GEMM raises, as TE's does, if it is missing)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.te_twin.cells import DTYPES, MODULES, need, recipe_sm_params, release_key

pytestmark = pytest.mark.twin


@pytest.mark.twin(every_release=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())
@pytest.mark.parametrize("module", MODULES)
def test_fp8_primary_weight_transpose_drop_then_a_step_is_bit_identical(
    release: str, module: str, recipe: str, sm: int, dtype: str
) -> None:
    """After every optimizer step the shim clears the model: where it drops the primary weights'
    transposes (`primary_weight_cleared`: the bytes dropped), the training that follows is
    bit-identical to the run that kept them; where it does not (TE < 2.4, or MXFP8 / block
    column-wise data, which is not a cache), `primary_weight_bytes` reports what stays in place.
    Float32 and bf16 parameters (the FP8 weights' fake dtype; their master copy stays float32)."""
    need(release, recipe, module)
    from harness.te_twin import training
    from te_offload_shim.te.caches import clear_fp8_workspaces
    from te_offload_shim.te.primary import TRANSPOSE_REBUILT_FROM

    reports: list[Any] = []
    dropped: list[bool] = []

    def clear(model: Any, step: int, microbatch: int) -> None:
        report = clear_fp8_workspaces(model, strict=True)
        reports.append(report)
        weights = [p for p in model.parameters() if type(p).__name__.startswith("Float8Tensor")]
        dropped.append(bool(weights) and all(getattr(p, "_transpose", None) is None for p in weights))

    def build() -> Any:
        return training.stack(module, recipe=recipe, fp8_weights=True, dtype=dtype)

    keep = training.train(build(), recipe)
    cleared = training.train(build(), recipe, after_step=clear)
    assert cleared.same(keep)
    assert all(r.entries == 0 and not r.errors for r in reports), [r.as_dict() for r in reports]
    if sm >= 100 and recipe in ("DelayedScaling", "Float8CurrentScaling"):
        # Blackwell: TE makes no transpose (its GEMM reads the row-wise data in any layout), so an
        # FP8 primary weight holds no copy beside its data: nothing to drop, nothing reported
        assert all(dropped), "a Float8Tensor weight with a transpose on sm100"
        assert all(r.primary_weight_params == 0 and r.primary_weight_bytes == 0 for r in reports), reports
        return
    assert all(r.primary_weight_params > 0 for r in reports), [r.as_dict() for r in reports]
    drops = recipe in ("DelayedScaling", "Float8CurrentScaling") and release_key(release) >= TRANSPOSE_REBUILT_FROM
    if drops:
        assert all(r.primary_weight_cleared > 0 and r.primary_weight_bytes == 0 for r in reports), reports
        assert all(dropped), dropped
        ways = {getattr(r, "primary_weight_dropped_by", "update_usage") for r in reports}
        assert ways <= {"clear_columnwise_cache", "remove_caches", "update_usage"}, ways
    else:
        assert all(r.primary_weight_cleared == 0 and r.primary_weight_bytes > 0 for r in reports), reports


@pytest.mark.twin(every_release=True)
def test_the_release_boundary_of_the_transpose_drop_a_drop_before_2_4_breaks_the_next_step(release: str) -> None:
    """Why the shim drops primary-weight transposes only from TE 2.4 (te/primary.py TRANSPOSE_REBUILT_FROM):
    the same drop through TE's own `update_usage(columnwise_usage=False)` after an optimizer step
    is rebuilt before the next dgrad from 2.4 on, and before 2.4 it is not: the next backward's
    dgrad GEMM raises TE's "missing column-wise usage" error (the twin is as strict as the GPU)."""
    from harness.te_twin import training
    from te_offload_shim.te.primary import TRANSPOSE_REBUILT_FROM

    def drop(model: Any, step: int, microbatch: int) -> None:
        for p in model.parameters():
            if getattr(p, "_transpose", None) is not None:
                p.update_usage(columnwise_usage=False)
                assert p._transpose is None

    model = training.stack("Linear", recipe="DelayedScaling", fp8_weights=True)
    if release_key(release) >= TRANSPOSE_REBUILT_FROM:
        training.train(model, "DelayedScaling", after_step=drop)
    else:
        with pytest.raises(RuntimeError, match="Input A is missing column-wise usage"):
            training.train(model, "DelayedScaling", after_step=drop)
