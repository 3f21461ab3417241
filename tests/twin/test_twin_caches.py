"""The caches TE's own forward makes, and what the shim reports and frees of them (on the twin:
TE's real Python, its compiled extension replaced by CPU kernels; tests/twin/conftest.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

from harness.te_twin.cells import DTYPES, MODULES, expected_keys, need, recipe_sm_params

pytestmark = pytest.mark.twin


@pytest.mark.twin(every_release=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())
@pytest.mark.parametrize("module", MODULES)
def test_caches_are_the_ones_te_forward_made_and_the_shim_counts_and_frees_them(
    release: str, module: str, recipe: str, sm: int, dtype: str
) -> None:
    """An empty `_fp8_workspaces` before the forward; after one forward(is_first_microbatch=True)
    and its backward, the keys TE's source uses, holding TE's own quantized values of the current
    weight; `scan` and `clear_fp8_workspaces` report exactly those entries and the bytes of their
    unique inner storages (found here by walking the values, not by the shim's field list), the
    dict is empty after the clear and the storages are freed."""
    need(release, recipe, module)
    from harness import te_twin
    from harness.te_twin import training
    from te_offload_shim.te.caches import clear_fp8_workspaces, scan

    model = training.build(module, dtype=dtype)
    assert model.__dict__["_fp8_workspaces"] == {}
    with te_twin.autocast(training.make_recipe(recipe)):
        y = training.forward(model, training.batch(0, 0, training.DTYPES[dtype]), True)
    y.float().square().mean().backward()
    del y
    entries = training.workspaces(model)
    assert sorted(k.split(".", 1)[1] for k in entries) == sorted(expected_keys(release, module))
    family = training.VALUE_FAMILY[recipe]
    weights = dict(model.named_parameters())  # a cache key is its weight's parameter name
    for key, value in entries.items():
        name = key.split(".", 1)[1]
        assert any(c.__name__.startswith(family) for c in type(value).__mro__), (key, type(value).__mro__)
        # the cached value is the quantized current weight (FP8's error: under 1/8 of each entry,
        # or of the block's amax for scaled blocks; E2M1's widest step is 4 to 6, so NVFP4 errs by
        # up to a sixth of a block's amax, times its E4M3 scale's rounding: under 1/4)
        weight = weights[name].detach()
        error = (value.dequantize().float() - weight.float()).abs()
        bound = float(weight.abs().max()) / (4 if recipe == "NVFP4BlockScaling" else 8)
        assert float(error.max()) <= bound, (key, float(error.max()))
    inner = [t for v in entries.values() for t in training.inner_tensors(v)]
    expected = training.unique_storage_bytes(inner)
    assert expected > 0
    seen = scan(model)
    assert (seen.entries, seen.bytes, seen.bytes_shared, seen.errors) == (len(entries), expected, 0, [])
    refs = [weakref.ref(t) for t in inner]
    del inner, entries, value
    report = clear_fp8_workspaces(model, strict=True)
    assert (report.entries, report.bytes, report.errors, report.skipped) == (seen.entries, expected, [], [])
    assert model.__dict__["_fp8_workspaces"] == {}
    alive = [t for t in (r() for r in refs) if t is not None]
    if alive:  # held by a reference cycle alone, a full collection frees it (~1 s on this heap: only when needed)
        del alive
        gc.collect()
        alive = [t for t in (r() for r in refs) if t is not None]
    assert not alive, f"{len(alive)} inner tensors still referenced after the clear: {[tuple(t.shape) for t in alive]}"
