"""The release x recipe x module cells of the twin tests: what each cell needs, why one cannot run,
and the training runs several tests compare (each made once per twin process).

Imported by the tests in tests/twin; everything that touches TE runs only inside a twin process
(tests/twin/conftest.py), where TE is already loaded.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

RECIPES = ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling")
MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
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
def keep_run(module: str, recipe: str) -> Any:
    """The reference: caches kept through 3 steps x 2 microbatches."""
    from harness.te_twin import training

    return training.train(training.build(module), recipe)


def clear_between_steps(model: Any, step: int, microbatch: int) -> None:
    from te_offload_shim.te.caches import clear_fp8_workspaces

    report = clear_fp8_workspaces(model, strict=True)
    cleared_entries.append(report.entries)


cleared_entries: list[int] = []
