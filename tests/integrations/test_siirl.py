"""The shim on the real siiRL (PyPI `siirl` 0.2.0 and 0.1.0.post1), each case in a fresh interpreter.

siiRL's `siirl.utils.megatron.megatron_utils.offload_megatron_model_to_cpu(models)` is a copy of verl's
pre-fix offload: it empties the megatron DDP buffers' storage itself (never through megatron-core's
buffer offload, so the `megatron-core` entry does not fire) and moves a plain chunk's parameters, then
flushes with `get_torch_device().empty_cache()`. Its workers module from-imports it
(`siirl.engine.megatron_workers` in 0.2.0, `siirl.workers.megatron_workers` before), and holds the
Megatron reward model, whose `offload_params_to_cpu` moves the reward model's parameters and flushes.
The model is the real megatron-core GPTModel the verl tests use, with TE-layout caches; the set-up
is tests/support/siirl_case.py's. This module imports nothing heavy at its top.
"""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from support.siirl_case import UTILS, build, offload_through_the_workers, on_path


def _check(world: SimpleNamespace, r: dict[str, Any], reward_entry: str) -> None:
    import te_offload_shim as shim

    assert world.initial["entries"] == 18 and world.initial["bytes"] > 0
    assert world.initial_reward["entries"] == 5
    assert r["flushes"] == [0], "the caches must be gone before siiRL's own allocator flush"
    assert r["layers"] == 1 and r["same_object"], "the workers' from-imported name is the wrapper"
    assert r["after"] == {"entries": 0, "bytes": 0}
    assert r["reward_flushes"] == [0] and r["reward_after"] == {"entries": 0, "bytes": 0}
    assert r["offloaded"], "siiRL really emptied the DDP buffers"
    assert r["same"], "weights round-trip bit-identical"
    stats = shim.stats()
    assert stats["by_target"] == {
        "siirl": {"calls": 1, "entries": 18, "bytes": world.initial["bytes"], "primary_weight_cleared": 0},
        reward_entry: {"calls": 1, "entries": 5, "bytes": world.initial_reward["bytes"], "primary_weight_cleared": 0},
    }, "one call each, and none for megatron-core (siiRL never calls the buffer offload)"
    state = {t["name"]: t["state"] for t in shim.status()["targets"]}
    assert state["siirl"] == state[reward_entry] == "patched"


def _installed_release_is_supported(release: str, *names: str) -> None:
    from importlib.metadata import version

    from te_offload_shim.integrations import versions
    from te_offload_shim.integrations.targets import BUILTIN

    assert version("siirl") == release
    for name in names:
        target = next(t for t in BUILTIN if t.name == name)
        assert versions.in_supported(target, release)[0] is True, name


ORDERS = ("shim-utils-workers", "utils-shim-workers", "utils-workers-shim")


@pytest.mark.subprocess(timeout=240)
@pytest.mark.parametrize("order", ORDERS)
def test_siirl_offload_clears_in_every_import_order(order: str) -> None:
    """The shim first; between siiRL's megatron_utils and the workers that from-import it; last,
    after the workers and the model (the workers' alias is then rebound)."""
    on_path("0.2.0")
    world = None
    for step in order.split("-"):
        if step == "shim":
            import te_offload_shim  # noqa: F401  (the first import installs)
        elif step == "utils":
            importlib.import_module(UTILS)
        else:
            importlib.import_module("siirl.engine.megatron_workers")
            if order.endswith("shim"):
                world = build()  # before the shim, too
    assert (UTILS in sys.modules) and "te_offload_shim" in sys.modules
    world = world or build()
    r = offload_through_the_workers(world, sys.modules["siirl.engine.megatron_workers"])
    _check(world, r, "siirl-reward")
    _installed_release_is_supported("0.2.0", "siirl", "siirl-reward")


@pytest.mark.subprocess(timeout=240)
def test_siirl_0_1_layout() -> None:
    """0.0.x - 0.1.x: the same offload, the workers and the reward model under `siirl.workers`."""
    import te_offload_shim

    on_path("0.1.0.post1")
    workers = importlib.import_module("siirl.workers.megatron_workers")
    assert "/siirl-0.1.0.post1/" in str(workers.__file__)
    assert "siirl.engine" not in sys.modules
    world = build()
    r = offload_through_the_workers(world, workers)
    _check(world, r, "siirl-reward-0.1")
    state = {t["name"]: t["state"] for t in te_offload_shim.status()["targets"]}
    assert state["siirl-reward"] == "pending", "0.2.0's module name is not imported under 0.1"
    _installed_release_is_supported("0.1.0.post1", "siirl", "siirl-reward-0.1")
