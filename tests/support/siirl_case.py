"""A real siiRL offload and reward-model offload on real megatron chunks, for tests running in a fresh
interpreter (tests/integrations/test_siirl.py, tests/tools/test_discover_rl_wheels.py, the siirl
cases of tests/support/entries.py). Imports nothing heavy at its top.

The releases sit in `.deps/siirl-X`, what their modules import beyond the test venv in
`.deps/siirl-pydeps` (scripts/setup-env.sh). The workers module imports `flash_attn.bert_padding` at
its top (by way of `siirl.engine.actor`); flash-attn is source-only on PyPI and builds only against
CUDA, and the offload never calls it, so the import-only stand-in of harness/te_import_only.py serves
it. On a CPU-only machine siiRL's `get_torch_device()` is `torch.cpu`, whose `empty_cache` (looked up
at call time) records here what is still cached at siiRL's own flush.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from types import ModuleType, SimpleNamespace
from typing import Any

from conftest import DEPS

from support.set_up import needs

UTILS = "siirl.utils.megatron.megatron_utils"


def on_path(release: str) -> None:
    """siiRL `release` and what it imports first on the path, flash_attn served by the stand-in."""
    folder = DEPS / f"siirl-{release}"
    needs(folder / "siirl", f"siirl {release} not installed in {folder}")
    logs = tempfile.mkdtemp(prefix="siirl-logs-")  # `import siirl` writes a log file (default: ./siirl_logs)
    atexit.register(shutil.rmtree, logs, True)
    os.environ["SIIRL_LOG_DIRECTORY"] = logs
    sys.path[:0] = [str(folder), str(DEPS / "siirl-pydeps")]
    from harness import te_import_only

    te_import_only.serve("flash_attn")


def build() -> SimpleNamespace:
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


def offload_through_the_workers(world: SimpleNamespace, workers: ModuleType) -> dict[str, Any]:
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
