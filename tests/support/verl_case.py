"""A real verl offload on a real megatron DDP chunk, for tests running in a fresh interpreter
(tests/integrations/test_verl.py, tests/engine/test_faults.py). Imports nothing heavy at its top."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

ENGINE = "verl.workers.engine.megatron.transformer_impl"  # the caller in 0.6.0+ (only one from 0.8.0)
WORKERS = "verl.workers.megatron_workers"  # the caller in 0.4.0 - 0.7.1
MODULE = "verl.utils.megatron_utils"  # the function's own module (0.4.0 and 0.6.1: their callers need flash_attn)


def build(spoil: Callable[[Any], None] | None = None) -> SimpleNamespace:
    """A DDP chunk with TE-layout caches (`spoil(model)` may then change them); verl's own flush on
    CPU records what is still cached at the moment the allocator is flushed."""
    import torch

    from harness import megatron_world as w

    model = w.wrap_ddp(w.build_gpt())
    w.attach_fp8_caches(model)
    if spoil is not None:
        spoil(model)
    world = SimpleNamespace(model=model, initial=w.cache_state([model]), before=w.weights(model), flushes=[])
    # torch.cpu has no empty_cache (apply_cpu_quirks adds one): this one replaces it
    torch.cpu.empty_cache = lambda: world.flushes.append(w.cache_state([model])["entries"])  # type: ignore[attr-defined]
    if not w.on_gpu():  # verl 0.4.0 flushes with torch.cuda.empty_cache itself (0.4.1 on: get_torch_device())
        torch.cuda.empty_cache = torch.cpu.empty_cache  # type: ignore[attr-defined]
    return world


def offload(world: SimpleNamespace, caller_name: str) -> dict[str, Any]:
    """verl's offload through `caller_name`'s from-imported name, then its reload; what happened."""
    from harness import megatron_world as w

    model = world.model
    caller = importlib.import_module(caller_name)
    caller.offload_megatron_model_to_cpu([model])
    offload_flushes = list(world.flushes)  # the offload's own flushes, not the reload's
    after = w.cache_state([model])
    offloaded = all(b.param_data.untyped_storage().size() == 0 for b in model.buffers)
    from verl.utils import megatron_utils as mu

    mu.load_megatron_model_to_gpu([model])
    import te_offload_shim as shim
    from te_offload_shim.engine.patch import shim_layers

    return {
        "initial": world.initial,
        "after": after,
        "flushes": offload_flushes,
        "offloaded": offloaded,
        "same": w.same_weights(world.before, w.weights(model)),
        "stats": shim.stats(),
        "caller_layers": shim_layers(caller.offload_megatron_model_to_cpu),
        "module_layers": shim_layers(mu.offload_megatron_model_to_cpu),
        "state": {t["name"]: t["state"] for t in shim.status()["targets"]},
    }
