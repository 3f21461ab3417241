"""A real megatron-core GPTModel, wrapped in megatron DDP, with TE-layout FP8 caches on its linears.

Used by the tests, the demo and the benchmarks. On a CPU-only machine it applies the few patches
that let megatron-core and verl's offload run there (listed in `apply_cpu_quirks`); on CUDA it applies
none and builds on the GPU.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from harness import te_standins

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")

_world_ready = False


def on_gpu() -> bool:
    return torch.cuda.is_available() and os.environ.get("HARNESS_FORCE_CPU") != "1"


def apply_cpu_quirks() -> None:
    """Only what megatron DDP and verl's offload need to run without an accelerator.

    - megatron DDP asks `torch.cuda.current_device()` for its buffers' device;
    - verl 0.4.1 - 0.7.1 call `.pin_memory()` and 0.8+ `torch.empty(..., pin_memory=True)`, which
      need an accelerator: here pinning returns a plain CPU *copy* (never `self`, which would alias);
    - verl 0.4.1 - 0.8.0 flush through `torch.cpu.empty_cache()`, which does not exist.
    """
    if on_gpu():
        return
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment, return-value]  # a device, not an index
    torch.Tensor.pin_memory = lambda self, *a, **k: self.clone()  # type: ignore[method-assign]
    real_empty = torch.empty

    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return real_empty(*args, **kwargs)

    torch.empty = empty  # type: ignore[assignment]
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None  # type: ignore[attr-defined]


def init_world() -> None:
    """World size 1, tensor/pipeline parallel 1: gloo on CPU, nccl on a GPU."""
    global _world_ready
    if _world_ready:
        return
    import torch.distributed as dist
    from megatron.core import parallel_state

    apply_cpu_quirks()
    if not dist.is_initialized():
        backend = "nccl" if on_gpu() else "gloo"
        if on_gpu():
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if on_gpu():
        model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    _world_ready = True


def build_gpt(layers: int = 2, hidden: int = 64, vocab: int = 128, **config: Any) -> Any:
    """A real `GPTModel` with megatron's local layer spec (no TE needed). Typed `Any`: megatron-core
    ships no type information (as an `nn.Module`, `model.decoder` would type as `Tensor | Module`)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    init_world()
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=4,
        use_cpu_initialization=True,
        bf16=False,
        params_dtype=torch.float32,
        **config,
    )
    model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=vocab, max_sequence_length=32)
    return model.cuda() if on_gpu() else model


def wrap_ddp(model: torch.nn.Module) -> Any:
    """megatron DDP with the distributed optimizer layout (the default leaves `param_data` None).
    Typed `Any` (megatron ships no types): its `buffers` is a list that shadows `nn.Module.buffers`."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    return DistributedDataParallel(model.config, ddp_config, model)


def device_memory() -> dict[str, int | None]:
    """Allocated and reserved (PyTorch's allocator), free and total (the driver): None on CPU."""
    if not on_gpu():
        return {"allocated": None, "reserved": None, "free": None, "total": None}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "free": free,
        "total": total,
    }


def linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The layers TE would replace (megatron's Column/RowParallelLinear in the local spec)."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("ParallelLinear")]


def attach_fp8_caches(model: torch.nn.Module, value_class: Any = te_standins.Float8TensorV2) -> int:
    """Give every linear a TE >= 1.8 workspace holding a quantized copy of its weight, as a TE
    forward with `is_first_microbatch` set would. Returns the number of entries."""
    entries = 0
    for _, layer in linear_layers(model):
        te_standins.attach_workspaces(layer, {"weight": value_class(layer.weight)})
        entries += 1
    return entries


def cache_state(model: Any) -> dict[str, int]:
    """Entries and bytes still cached in `model` (a module or a list of chunks).

    An oracle independent of the shim (importing the shim would install it, and the code under test
    must not grade itself): it knows the stand-ins' inner tensors."""
    chunks = [model] if isinstance(model, torch.nn.Module) else list(model)
    entries, storages = 0, {}
    for chunk in chunks:
        for module in chunk.modules():
            ws = module.__dict__.get("_fp8_workspaces")
            if not isinstance(ws, dict) or not ws:
                continue
            entries += len(ws)
            for value in ws.values():
                for t in te_standins.inner_tensors(value):
                    storage = t.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
    return {"entries": entries, "bytes": sum(storages.values())}


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
