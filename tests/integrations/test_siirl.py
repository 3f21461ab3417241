"""The shim on the real siiRL (PyPI `siirl` 0.2.0 and 0.1.0.post1), each case in a fresh interpreter.

siiRL's `siirl.utils.megatron.megatron_utils.offload_megatron_model_to_cpu(models)` is a copy of verl's
pre-fix offload: it empties the megatron DDP buffers' storage itself (never through megatron-core's
buffer offload, so the `megatron-core` entry does not fire) and moves a plain chunk's parameters, then
flushes with `get_torch_device().empty_cache()`. Its workers module from-imports it
(`siirl.engine.megatron_workers` in 0.2.0, `siirl.workers.megatron_workers` before), and holds the
Megatron reward model, whose `offload_params_to_cpu` moves the reward model's parameters and flushes.

The releases sit in `.deps/siirl-X`, what their modules import beyond the test venv in
`.deps/siirl-pydeps` (scripts/setup-env.sh). The workers module imports `flash_attn.bert_padding` at
its top (by way of `siirl.engine.actor`); flash-attn is source-only and builds only against CUDA, and
the offload never calls it, so the import-only stand-in of harness/te_import_only.py serves it. The
model is the real megatron-core GPTModel the verl tests use, with TE-layout caches; on a CPU-only
machine siiRL's `get_torch_device()` is `torch.cpu`, whose `empty_cache` records what is still
cached at siiRL's own flush. This module imports nothing heavy at its top.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from conftest import DEPS

RELEASES = {"0.2.0": "siirl.engine", "0.1.0.post1": "siirl.workers"}  # where the workers live
UTILS = "siirl.utils.megatron.megatron_utils"


def _on_path(release: str, logs: Path) -> None:
    folder = DEPS / f"siirl-{release}"
    if not (folder / "siirl").is_dir():
        pytest.skip(f"siirl {release} not installed in {folder} (run scripts/setup-env.sh)")
    os.environ["SIIRL_LOG_DIRECTORY"] = str(logs)  # `import siirl` writes a log file there (default: ./siirl_logs)
    sys.path[:0] = [str(folder), str(DEPS / "siirl-pydeps")]
    from harness import te_import_only

    te_import_only.serve("flash_attn")


def _world() -> SimpleNamespace:
    """The policy in megatron DDP, the reference model as a plain chunk, a reward model chunk, all
    with TE-layout caches; siiRL's flush (`torch.cpu.empty_cache` here) records what is cached."""
    import torch

    from harness import megatron_world as w

    models = [w.wrap_ddp(w.build_gpt()), w.build_gpt()]
    reward = torch.nn.ModuleList([w.build_gpt(layers=1)])  # siiRL keeps its reward model chunks in one
    for chunk in [*models, *reward]:
        w.attach_fp8_caches(chunk)
    world = SimpleNamespace(
        models=models,
        reward=reward,
        initial=w.cache_state(models),
        initial_reward=w.cache_state(list(reward)),
        before=[w.weights(m) for m in [*models, *reward]],
        flushes=[],
        watching=models,
    )
    torch.cpu.empty_cache = lambda: world.flushes.append(w.cache_state(world.watching)["entries"])  # type: ignore[attr-defined]
    return world


def _offload_through_the_workers(world: SimpleNamespace, workers: ModuleType) -> dict[str, Any]:
    """siiRL's offload through the workers' own from-imported name, its reward model's offload, then
    their reloads; what happened, read independently of the shim where it can be."""
    from harness import megatron_world as w
    from te_offload_shim.engine.patch import shim_layers

    utils = sys.modules[UTILS]
    result: dict[str, Any] = {
        "layers": shim_layers(workers.offload_megatron_model_to_cpu),
        "same_object": workers.offload_megatron_model_to_cpu is utils.offload_megatron_model_to_cpu,
    }
    workers.offload_megatron_model_to_cpu(world.models)  # what e.g. ActorRolloutRefWorker.init_model calls
    ddp = world.models[0]
    result["flushes"], world.flushes[:] = list(world.flushes), []
    result["after"] = w.cache_state(world.models)
    result["offloaded"] = all(b.param_data.untyped_storage().size() == 0 for b in ddp.buffers)

    config = SimpleNamespace(megatron=SimpleNamespace(param_offload=False))
    reward_model = workers.MegatronRewardModel(
        config=config, model_config=None, reward_model_module=world.reward, hf_config=None, tf_config=None
    )
    world.watching = list(world.reward)
    reward_model.offload_params_to_cpu()  # `megatron.param_offload` after each compute_reward
    result["reward_flushes"], world.flushes[:] = list(world.flushes), []
    result["reward_after"] = w.cache_state(world.watching)

    utils.load_megatron_model_to_gpu(world.models)
    reward_model.load_params_to_cuda()
    after = [w.weights(m) for m in [*world.models, *world.reward]]
    result["same"] = all(w.same_weights(b, a) for b, a in zip(world.before, after, strict=True))
    return result


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
        "siirl": {"calls": 1, "entries": 18, "bytes": world.initial["bytes"]},
        reward_entry: {"calls": 1, "entries": 5, "bytes": world.initial_reward["bytes"]},
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
def test_siirl_offload_clears_in_every_import_order(order: str, tmp_path: Path) -> None:
    """The shim first; between siiRL's megatron_utils and the workers that from-import it; last,
    after the workers and the model (the workers' alias is then rebound)."""
    _on_path("0.2.0", tmp_path)
    world = None
    for step in order.split("-"):
        if step == "shim":
            import te_offload_shim  # noqa: F401  (the first import installs)
        elif step == "utils":
            importlib.import_module(UTILS)
        else:
            importlib.import_module("siirl.engine.megatron_workers")
            if order.endswith("shim"):
                world = _world()  # before the shim, too
    assert (UTILS in sys.modules) and "te_offload_shim" in sys.modules
    world = world or _world()
    r = _offload_through_the_workers(world, sys.modules["siirl.engine.megatron_workers"])
    _check(world, r, "siirl-reward")
    _installed_release_is_supported("0.2.0", "siirl", "siirl-reward")


@pytest.mark.subprocess(timeout=240)
def test_siirl_0_1_layout(tmp_path: Path) -> None:
    """0.0.x - 0.1.x: the same offload, the workers and the reward model under `siirl.workers`."""
    import te_offload_shim

    _on_path("0.1.0.post1", tmp_path)
    workers = importlib.import_module("siirl.workers.megatron_workers")
    assert "/siirl-0.1.0.post1/" in str(workers.__file__)
    assert "siirl.engine" not in sys.modules
    world = _world()
    r = _offload_through_the_workers(world, workers)
    _check(world, r, "siirl-reward-0.1")
    state = {t["name"]: t["state"] for t in te_offload_shim.status()["targets"]}
    assert state["siirl-reward"] == "pending", "0.2.0's module name is not imported under 0.1"
    _installed_release_is_supported("0.1.0.post1", "siirl", "siirl-reward-0.1")
