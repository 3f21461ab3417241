"""The release x recipe x module cells of the twin tests (tests/twin): what each cell needs, why
one cannot run (a pytest skip with the reason), and the training runs several tests compare (each
made once per twin process). Everything that touches TE runs only inside a twin process
(tests/twin/conftest.py), where TE is already loaded.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

# Every TE 2.x release the class probe installs (harness/te_releases.py). FULL_MATRIX releases run
# every test: float32 and bf16 parameters, the per-copy negative controls, the kernel tests (the
# newest release; 2.9, the first of the `*TensorStorage` era with its uninitialised `_scale_inv`;
# 2.4, the last that fills it with the reciprocal). The others run the tests marked
# `twin(every_release=True)` with bf16 parameters, as Megatron's --bf16 trains: float32 adds its case
# (the quantize from float32) on the FULL_MATRIX releases. The CI budget (a fresh clone's `.ci/run`
# under 20 minutes on 2 cores) sets this split: docs/te-twin.md gives the matrix.
TWIN_RELEASES = ("2.20.2", "2.19.0", "2.18.0", "2.16.1", "2.12.0", "2.10.0", "2.9.0", "2.8.0", "2.4.0", "2.1.0")
FULL_MATRIX = ("2.20.2", "2.9.0", "2.4.0")
# TE 1.x is not twinned (tests/twin/test_twin_releases.py checks this reason in the wheels).
NOT_TWINNED = {
    "1.13.0": (
        "TE 1.x is not twinned: its GEMM, casts and activations are TorchScript ops its compiled library "
        "registers (torch.ops.tex_ts.te_gemm_ts, cast_to_fp8_ts, gelu_ts, ...) beside a 1.x extension API "
        "(fused_cast_transpose_noop, layernorm_fwd_fp8, the FP8TensorMeta class) that TE 2.x replaced, and its "
        "transformer_engine/pytorch/__init__.py fails on torch 2.13 (torch.onnx._type_utils, removed in torch 2.6)"
    ),
}
# The first release with each recipe (transformer_engine/common/recipe.py; Megatron's fp8_utils.py
# asks the same: tensorwise from 2.2, blockwise from 2.3): older releases' cells of it are not
# collected (tests/twin/conftest.py), where they would exist only to skip.
RECIPE_SINCE = {"Float8CurrentScaling": (2, 2), "Float8BlockScaling": (2, 3), "NVFP4BlockScaling": (2, 8)}
RECIPES = ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")
MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
# (recipe, GPU architecture) cells: per-tensor FP8 on Hopper and on Blackwell, where TE's GEMM reads
# other buffers (any layout from the row-wise data; no transpose is made); FP8 block scaling on
# Hopper (TE's block-scaled GEMM requires it before 2.10 and the twin's sm100 path is MXFP8's);
# MXFP8 and NVFP4 on Blackwell (TE requires sm100). tests/twin/conftest.py runs each sm in a process of
# its own.
RECIPE_SM = (
    ("DelayedScaling", 90),
    ("DelayedScaling", 100),
    ("Float8CurrentScaling", 90),
    ("Float8CurrentScaling", 100),
    ("Float8BlockScaling", 90),
    ("MXFP8BlockScaling", 100),
    ("NVFP4BlockScaling", 100),
)
DTYPES = ("float32", "bf16")  # params_dtype: float32, and bf16 as Megatron's --bf16 trains
# Recipes TE runs on bf16 activations only, with TE's reason: their float32 cells are not collected
# (tests/twin/conftest.py), the tests without a dtype parameter run them in bf16 (`dtype_for`), and
# test_twin_kernels.py checks that the refusal is TE's own error.
BF16_ONLY = {
    "NVFP4BlockScaling": (
        "TE's NVFP4 recipe applies the random Hadamard transform to inputs and gradients, and its C++ "
        "refuses it for anything but bf16 input (csrc/quantizer.cpp: 'RHT is only supported for bfloat16 input')"
    ),
}


def dtype_for(recipe: str) -> str:
    """The parameter type a test without a dtype parameter trains `recipe` in."""
    return "bf16" if recipe in BF16_ONLY else "float32"


def recipe_sm_params() -> list[Any]:
    """`@pytest.mark.parametrize(("recipe", "sm"), recipe_sm_params())`, ids like DelayedScaling-sm90."""
    return [pytest.param(recipe, sm, id=f"{recipe}-sm{sm}") for recipe, sm in RECIPE_SM]


# The copies a cached value holds, by family and architecture, and which GEMM of a microbatch reads
# each (cublaslt_gemm.cu CanonicalizeGemmInput; harness/te_twin/gemm.py): the forward (`x @ W.T`,
# TN) and the dgrad (`dy @ W`, NN). Per-tensor FP8 has one scale-inverse for both its copies; on
# Blackwell it keeps only the row-wise data, which both GEMMs read. NVFP4's GEMM also reads each
# direction's own per-tensor amax from the cached value (cuBLAS's alpha: amax_A * amax_B / (6 * 448)^2).
COPIES: dict[tuple[str, int], dict[str, tuple[str, frozenset[str]]]] = {
    ("float8", 90): {
        "rowwise_data": ("_data", frozenset({"forward"})),
        "columnwise_data": ("_transpose", frozenset({"dgrad"})),
        "scale_inv": ("_scale_inv", frozenset({"forward", "dgrad"})),
    },
    ("float8", 100): {
        "rowwise_data": ("_data", frozenset({"forward", "dgrad"})),
        "scale_inv": ("_scale_inv", frozenset({"forward", "dgrad"})),
    },
    **{
        (family, sm): {
            "rowwise_data": ("_rowwise_data", frozenset({"forward"})),
            "rowwise_scale_inv": ("_rowwise_scale_inv", frozenset({"forward"})),
            "columnwise_data": ("_columnwise_data", frozenset({"dgrad"})),
            "columnwise_scale_inv": ("_columnwise_scale_inv", frozenset({"dgrad"})),
        }
        for family, sm in (("block", 90), ("mxfp8", 100))
    },
    ("nvfp4", 100): {
        "rowwise_data": ("_rowwise_data", frozenset({"forward"})),
        "rowwise_scale_inv": ("_rowwise_scale_inv", frozenset({"forward"})),
        "amax_rowwise": ("_amax_rowwise", frozenset({"forward"})),
        "columnwise_data": ("_columnwise_data", frozenset({"dgrad"})),
        "columnwise_scale_inv": ("_columnwise_scale_inv", frozenset({"dgrad"})),
        "amax_columnwise": ("_amax_columnwise", frozenset({"dgrad"})),
    },
}
FAMILY = {
    "DelayedScaling": "float8",
    "Float8CurrentScaling": "float8",
    "Float8BlockScaling": "block",
    "MXFP8BlockScaling": "mxfp8",
    "NVFP4BlockScaling": "nvfp4",
}


def copy_params() -> list[Any]:
    """(recipe, sm, copy) cells of the per-copy negative control."""
    return [
        pytest.param(recipe, sm, copy, id=f"{recipe}-sm{sm}-{copy}")
        for recipe, sm in RECIPE_SM
        for copy in COPIES[FAMILY[recipe], sm]
    ]


# Recipes the twin's kernels do not implement yet (their cells skip, saying so).
NOT_IMPLEMENTED: dict[str, str] = {}


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".")[:3])


# Cells TE itself refuses in a release (its own error, raised on a GPU too): (first release that
# accepts it, module, recipe) -> TE's message.
TE_REFUSES = {
    ((2, 3), "GroupedLinear", "MXFP8BlockScaling"): "GroupedLinear does not yet support MXFP8 (grouped_linear.py)",
}


def need(release: str, recipe: str, module: str | None = None) -> None:
    """Skip the cell, with the reason, when the release or the twin cannot run it."""
    from harness.te_twin import training

    if training.recipe_class(recipe) is None:
        pytest.skip(f"TE {release} has no {recipe} recipe")
    if recipe in NOT_IMPLEMENTED:
        pytest.skip(NOT_IMPLEMENTED[recipe])
    for (since, name, refused), message in TE_REFUSES.items():
        if (name, refused) == (module, recipe) and release_key(release) < since:
            pytest.skip(f"TE {release} itself refuses it: {message}")


def expected_keys(release: str, module: str) -> list[str]:
    """The cache keys the module's forward fills (harness/te_releases.py, read from each release's
    source by tests/test_te_real.py), for the twin's layer sizes."""
    from harness import te_releases
    from harness.te_twin import training

    keys = []
    for key in te_releases.BOUNDARIES[release]["keys"][module]:
        if key == "weight" and module == "GroupedLinear":
            continue  # single_grouped_weight=True only (2.19+): not the twin's layers
        keys += [key.replace("{i}", str(i)) for i in range(training.GROUPS)] if "{i}" in key else [key]
    return keys


@functools.cache
def keep_run(module: str, recipe: str, dtype: str = "float32") -> Any:
    """The reference: caches kept through 3 steps x 2 microbatches."""
    from harness.te_twin import training

    return training.train(training.build(module, dtype=dtype), recipe)


def clear_between_steps(model: Any, step: int, microbatch: int) -> None:
    from te_offload_shim.te.caches import clear_fp8_workspaces

    report = clear_fp8_workspaces(model, strict=True)
    cleared_entries.append(report.entries)


cleared_entries: list[int] = []
