"""The whole stack on TE's CPU twin: a real megatron-core `GPTModel` built from
`get_gpt_layer_with_transformer_engine_spec()`, so its linears and attention are TE's own modules
(harness/te_twin), in megatron DDP, trained through Megatron's own schedule
(`get_forward_backward_func()`), with whatever offload the caller runs after each step.

Used by tests/twin/test_twin_stack.py and the demo. One TE release per process (`load`), as for the twin.
Importing this module imports nothing heavy (the test module that names RELEASES runs in the suite).

What the stack needs beyond the twin's kernels, and why:
- the CUDA RNG that Megatron's `CudaRNGStatesTracker` forks around every initialisation
  (harness/te_twin/cuda_rng.py);
- `attention_backend=unfused`: TE's `DotProductAttention` on its PyTorch path (the flash and
  cuDNN fused kernels are not twinned); TE asks the extension's `get_cudnn_version()` while it
  chooses (the twin answers cuDNN 9);
- fusions off (gradient accumulation into `main_grad`, RoPE, masked softmax, bias-dropout-add):
  each is a CUDA kernel (Apex's, TE's or a TorchScript/torch.compile one for the GPU);
- dropout 0: a deterministic step, so two runs can be compared to the bit;
- plain SGD on `main_grad` after Megatron's `finalize_model_grads` instead of Megatron's
  `DistributedOptimizer`, which asserts `param.type() == "torch.cuda.FloatTensor"` (a CPU
  parameter is a `torch.FloatTensor`). The DDP buffers are laid out for the distributed optimizer
  (`use_distributed_optimizer=True`), as in verl: with the default layout `param_data` is None and
  verl's offload has nothing to move.
- `pin_memory=True` (verl 0.8's offload buffer) is dropped by the twin's redirect of "cuda"
  allocations to the CPU (harness/te_twin/redirect.py).
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# The releases the stack runs on here (tests/twin/test_twin_stack.py: each of them, both recipes but 2.1's)
RELEASES = ("2.20.2", "2.16.1", "2.9.0", "2.4.0", "2.1.0")
# TransformerConfig.fp8 -> the fp8_recipe it runs with by default: "hybrid" (E4M3 forward, E5M2
# grads) under delayed scaling, "e4m3" under per-tensor current scaling
FP8 = {"hybrid": "delayed", "e4m3": "tensorwise"}
# TransformerConfig.fp4 -> its fp4_recipe: "e2m1" runs NVFP4 (megatron/core/fp4_utils.py get_fp4_recipe)
FP4 = {"e2m1": "nvfp4"}
# Megatron's fp8_recipe / fp4_recipe -> the TE recipe class it makes (fp8_utils.py get_fp8_recipe,
# fp4_utils.py get_fp4_recipe)
RECIPE_CLASS = {
    "delayed": "DelayedScaling",
    "tensorwise": "Float8CurrentScaling",
    "blockwise": "Float8BlockScaling",
    "mxfp8": "MXFP8BlockScaling",
    "nvfp4": "NVFP4BlockScaling",
}
SEQ, MICRO_BATCH, VOCAB = 16, 2, 128  # FP8 GEMMs want dimensions that are multiples of 16
SEED = 1234
LR = 0.05

Models = list[Any]


def load(release: str, sm: int = 90) -> types.ModuleType:
    """TE `release` on the twin as an sm`sm` GPU (100 for MXFP8), the CUDA RNG answered, torch
    single-threaded (bit-reproducible)."""
    import torch

    from harness import te_twin
    from harness.te_twin import cuda_rng

    te = te_twin.load(release, sm=sm)
    cuda_rng.install()
    torch.set_num_threads(1)
    # CUDA's generator is the CPU's here (harness/te_twin/device.py), so every initialisation inside
    # the tracker's fork() advances "the CPU RNG" and Megatron warns each time: expected, not news
    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    return te


def init_world(backend: str = "gloo") -> None:
    """World size 1 over gloo (nccl for real TE on a GPU), tensor/pipeline parallel 1."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def build(
    fp8: str,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    recipe: str | None = None,
    bf16: bool = False,
    cuda: bool = False,
    frozen: Callable[[str], bool] | None = None,
    wrap: bool = True,
) -> Any:
    """A freshly seeded GPTModel from TE's layer spec, FP8 `fp8` ("hybrid" or "e4m3") with Megatron's
    fp8_recipe `recipe` (RECIPE_CLASS; default FP8[fp8]), or FP4 with `fp8="e2m1"` (Megatron's `fp4`
    and `fp4_recipe`, default "nvfp4"), float32 or bf16 parameters (Megatron's
    --bf16), in megatron DDP (`wrap=False`: the bare model, as a reference model is built); `cuda`: on
    a real GPU with TE's real extension (the demo's "te" mode: nccl, the model moved to the GPU).
    `frozen(name)`: the parameters it names have `requires_grad=False` before DDP is built, so they
    stay out of its buffers (the base weights of a LoRA run). Typed `Any`: megatron ships no types."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    formats = {**FP8, **FP4}
    if fp8 not in formats:
        raise ValueError(f"fp8 must be one of {', '.join(formats)}, not {fp8!r}")
    recipe = recipe or formats[fp8]
    if recipe not in RECIPE_CLASS:
        raise ValueError(f"recipe must be one of {', '.join(RECIPE_CLASS)}, not {recipe!r}")
    # Megatron refuses fp8 and fp4 together (TransformerConfig.__post_init__)
    precision = {"fp4": fp8, "fp4_recipe": recipe} if fp8 in FP4 else {"fp8": fp8, "fp8_recipe": recipe}
    init_world("nccl" if cuda else "gloo")
    model_parallel_cuda_manual_seed(SEED)
    torch.manual_seed(SEED)
    config = TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        use_cpu_initialization=True,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        **precision,
        attention_backend="unfused",
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    config.finalize_model_grads_func = finalize_model_grads
    model = GPTModel(config, get_gpt_layer_with_transformer_engine_spec(), vocab_size=VOCAB, max_sequence_length=SEQ)
    for name, param in model.named_parameters():
        if frozen is not None and frozen(name):
            param.requires_grad_(False)
    if bf16:  # as Megatron's get_model does under --bf16: parameters cast, inputs and outputs converted
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    if cuda:
        model = model.cuda()
    if not wrap:
        return model
    return DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)


def _tokens(step: int, microbatch: int) -> torch.Tensor:
    import torch

    g = torch.Generator().manual_seed(1000 + 10 * step + microbatch)
    return torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=g)


def train_step(
    ddp: Any,
    step: int,
    microbatches: int = 2,
    device: str | None = None,
    *,
    between: Callable[[int], None] | None = None,
    forward_only: bool = False,
) -> list[torch.Tensor]:
    """One optimizer step of `microbatches` microbatches through Megatron's schedule (which marks
    the first microbatch, so TE quantizes each weight once and reuses its cache for the others, and
    runs `finalize_model_grads`), then SGD on `main_grad` (frozen parameters left alone). Returns
    the microbatches' losses. `between(i)` runs before the forward of every microbatch i > 0;
    `forward_only`: the schedule's forward-only pass and no update (`ddp` may be a bare model)."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    positions = torch.arange(SEQ, device=device).unsqueeze(0).expand(MICRO_BATCH, SEQ)

    seen: list[torch.Tensor] = []

    def forward_step(data: Iterator[torch.Tensor], model: Any) -> tuple[torch.Tensor, Callable]:
        tokens = next(data)
        if seen and between is not None:
            between(len(seen))
        seen.append(tokens)
        output = model(tokens[:, :-1], positions, None, labels=tokens[:, 1:])

        def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach().clone()}

        return output, loss_func

    if not forward_only:
        ddp.zero_grad_buffer()
    data = iter([_tokens(step, mb).to(device) for mb in range(microbatches)])
    out = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=data,
        model=[ddp],
        num_microbatches=microbatches,
        seq_length=SEQ,
        micro_batch_size=MICRO_BATCH,
        forward_only=forward_only,
    )
    if not forward_only:
        with torch.no_grad():
            for param in ddp.module.parameters():
                if param.requires_grad:
                    param -= LR * param.main_grad  # in place: the parameter is a view of the DDP buffer
    return [record["loss"] for record in out]


def fp8_workspaces(models: Models) -> list[tuple[str, str, Any]]:
    """Every entry in a TE module's `_fp8_workspaces`: (module name, key, value)."""
    found = []
    for chunk in models:
        for name, module in chunk.named_modules():
            for key, value in module.__dict__.get("_fp8_workspaces", {}).items():
                found.append((name, key, value))
    return found


# TE's per-tensor FP8 value classes: the tensor, or the storage object without a tensor wrapper
# that a cache may hold (2.0 - 2.8 `Float8TensorBase`, 2.9+ `Float8TensorStorage`)
FLOAT8 = frozenset({"Float8Tensor", "Float8TensorBase", "Float8TensorStorage"})


def float8_class(value: Any) -> str | None:
    """The name of TE's per-tensor FP8 class `value` is (or derives from), None for anything else."""
    for cls in type(value).__mro__:
        if cls.__name__ in FLOAT8 and cls.__module__.startswith("transformer_engine."):
            return cls.__name__
    return None


# Every TE quantized value class a cache may hold: per-tensor FP8, FP8 blocks, MXFP8, NVFP4 (tensor,
# 2.0 - 2.8 base, 2.9+ storage)
QUANTIZED = FLOAT8 | {
    f"{name}{suffix}"
    for name in ("MXFP8Tensor", "Float8BlockwiseQTensor", "NVFP4Tensor")
    for suffix in ("", "Base", "Storage")
}


def quantized_class(value: Any) -> str | None:
    """The name of TE's quantized class `value` is (or derives from), None for anything else."""
    for cls in type(value).__mro__:
        if cls.__name__ in QUANTIZED and cls.__module__.startswith("transformer_engine."):
            return cls.__name__
    return None


def te_quantized_entries(models: Models) -> int:
    """How many cached values are TE's own quantized tensors (or storage objects), any recipe."""
    return sum(1 for _, _, value in fp8_workspaces(models) if quantized_class(value) is not None)


def te_float8_entries(models: Models) -> int:
    """How many cached values are TE's own per-tensor FP8 tensors (or their storage objects)."""
    return sum(1 for _, _, value in fp8_workspaces(models) if float8_class(value) is not None)


def cache_state(models: Models) -> dict[str, int]:
    """Entries cached and the bytes of their unique inner storages, found by walking each value's
    attributes (harness/te_twin/training.py): an oracle independent of the shim's own field list."""
    from harness.te_twin import training

    entries = fp8_workspaces(models)
    tensors = [t for _, _, value in entries for t in training.inner_tensors(value)]
    return {"entries": len(entries), "bytes": training.unique_storage_bytes(tensors)}


@contextlib.contextmanager
def flushes(models: Models) -> Iterator[list[int]]:
    """Inside: each `torch.cuda.empty_cache()` (verl's own allocator flush, which frees nothing on
    the twin) records how many TE quantized caches `models` still hold at that moment."""
    import torch

    seen: list[int] = []
    flush = torch.cuda.empty_cache
    torch.cuda.empty_cache = lambda: seen.append(te_quantized_entries(models))  # type: ignore[assignment]
    try:
        yield seen
    finally:
        torch.cuda.empty_cache = flush  # type: ignore[assignment]


def weights(ddp: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in ddp.module.named_parameters()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )
