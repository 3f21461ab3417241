"""Small training runs of TE's own modules on the twin, for the twin tests and benchmarks.

A run is `steps` optimizer steps of `microbatches` microbatches each, forward with
`is_first_microbatch=True` on a step's first microbatch and False on the others (Megatron's
gradient accumulation, which is when TE caches the quantized weights), inside TE's FP8 autocast
with a fresh recipe object per run. Hooks let a test act where an offload would: after a step's
optimizer update (`after_step`, between steps) or before a microbatch (`before_microbatch`,
mid-step). The input needs a gradient, as every layer's input does in a model, so each backward
runs the dgrad GEMM and each cache holds the copies TE makes in training (row-wise for the
forward, column-wise for the dgrad). Parameters are float32 or bf16 (`params_dtype`, Megatron's
`--bf16`). Everything is seeded and single-threaded, so two runs that do the same arithmetic agree
to the bit.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from harness import te_twin

HIDDEN, OUT, FFN = 128, 128, 256  # multiples of 128: FP8 block scaling's tiles, MXFP8's 32-blocks, NVFP4's 16s
TOKENS = 64  # two GroupedLinear splits of 32: MXFP8 needs multiples of 32
GROUPS = 2
RECIPES = ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")
MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
# What TE's GEMM-operand values are, by recipe (the classes a forward caches)
VALUE_FAMILY = {
    "DelayedScaling": "Float8Tensor",
    "Float8CurrentScaling": "Float8Tensor",
    "Float8BlockScaling": "Float8BlockwiseQTensor",
    "MXFP8BlockScaling": "MXFP8Tensor",
    "NVFP4BlockScaling": "NVFP4Tensor",
}

Hook = Callable[[Any, int, int], None]


def te() -> Any:
    return importlib.import_module("transformer_engine.pytorch")


def recipe_class(name: str) -> type | None:
    """The release's recipe class by name, None where the release has none."""
    recipes = importlib.import_module("transformer_engine.common.recipe")
    cls = getattr(recipes, name, None)
    return cls if isinstance(cls, type) else None


def make_recipe(name: str) -> Any:
    cls = recipe_class(name)
    if cls is None:
        raise LookupError(f"TE has no {name} recipe")
    return cls()


DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}


def build(
    module: str, seed: int = 0, *, recipe: str | None = None, fp8_weights: bool = False, dtype: str = "float32"
) -> torch.nn.Module:
    """One of TE's modules (parameters of `dtype`: "float32" or "bf16"), built from a seed; with
    `fp8_weights` inside TE's FP8 model init, so its weights are FP8 primary weights of `recipe`."""
    torch.manual_seed(seed)
    cls = getattr(te(), module)

    def make() -> torch.nn.Module:
        kwargs: dict[str, Any] = {"params_dtype": DTYPES[dtype]}
        if module == "GroupedLinear":
            return cls(GROUPS, HIDDEN, OUT, **kwargs)
        if module == "LayerNormMLP":
            return cls(HIDDEN, FFN, **kwargs)
        return cls(HIDDEN, OUT, **kwargs)

    if not fp8_weights:
        return make()
    with te_twin.model_init(make_recipe(recipe) if recipe else None):
        return make()


def stack(
    module: str, seed: int = 0, *, recipe: str | None = None, fp8_weights: bool = False, dtype: str = "float32"
) -> torch.nn.Module:
    """Two of TE's modules in a row: the second one's input is the first one's output, so its
    dgrad GEMM reads its weight's column-wise copy and feeds the first one's backward."""
    first = build(module, seed, recipe=recipe, fp8_weights=fp8_weights, dtype=dtype)
    second = build(module, seed + 1, recipe=recipe, fp8_weights=fp8_weights, dtype=dtype)
    return torch.nn.ModuleList([first, second])


def batch(step: int, microbatch: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A microbatch's input, needing a gradient (as a layer's input does in a model)."""
    g = torch.Generator().manual_seed(1000 + 10 * step + microbatch)
    return torch.randn(TOKENS, HIDDEN, generator=g).to(dtype).requires_grad_(True)


def dtype_of(model: torch.nn.Module) -> torch.dtype:
    """The model's parameter type (TE's `params_dtype`; the activations' type)."""
    return next(model.parameters()).dtype


def layers_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model) if isinstance(model, torch.nn.ModuleList) else [model]


def forward(model: torch.nn.Module, x: torch.Tensor, first: bool | None) -> torch.Tensor:
    for layer in layers_of(model):
        if type(layer).__name__ == "GroupedLinear":
            x = layer(x, [TOKENS // GROUPS] * GROUPS, is_first_microbatch=first)
        else:
            x = layer(x, is_first_microbatch=first)
    return x


@dataclasses.dataclass
class Run:
    """What a run produced: one loss and one input gradient per microbatch, each step's gradients,
    the final weights."""

    losses: list[torch.Tensor] = dataclasses.field(default_factory=list)
    input_grads: list[torch.Tensor] = dataclasses.field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def same(self, other: Run) -> bool:
        """Bit-identical losses, gradients and weights."""
        return (
            len(self.losses) == len(other.losses)
            and all(_equal(a, b) for a, b in zip(self.losses, other.losses, strict=True))
            and len(self.input_grads) == len(other.input_grads)
            and all(_equal(a, b) for a, b in zip(self.input_grads, other.input_grads, strict=True))
            and len(self.grads) == len(other.grads)
            and all(_same_dict(a, b) for a, b in zip(self.grads, other.grads, strict=True))
            and _same_dict(self.weights, other.weights)
        )

    def max_loss_diff(self, other: Run) -> float:
        return max(float((a - b).abs()) for a, b in zip(self.losses, other.losses, strict=True))

    def max_weight_diff(self, other: Run) -> float:
        return max(float((self.weights[k] - other.weights[k]).abs().max()) for k in self.weights)


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _same_dict(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(_equal(a[k].reshape(-1), b[k].reshape(-1)) for k in a)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A parameter's values as a plain float32 tensor (an FP8 primary weight dequantized)."""
    dequantize = getattr(t, "dequantize", None)
    value = dequantize() if callable(dequantize) and type(t) is not torch.nn.Parameter else t
    return value.detach().float().clone()


class SGD:
    """Plain SGD that also updates FP8 primary weights the way Megatron does: a float32 master copy
    is updated and quantized back into the parameter (TE's `quantize_`)."""

    def __init__(self, model: torch.nn.Module, lr: float = 0.05) -> None:
        self.lr = lr
        self.params: list[tuple[str, Any]] = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.master = {n: _plain(p) for n, p in self.params if type(p) is not torch.nn.Parameter}

    def step(self) -> None:
        with torch.no_grad():
            for name, p in self.params:
                grad = p.grad
                if grad is None:
                    continue
                if name in self.master:
                    self.master[name] -= self.lr * grad.float()
                    p.quantize_(self.master[name])
                else:
                    p -= self.lr * grad

    def zero_grad(self) -> None:
        for _, p in self.params:
            p.grad = None


def train(
    model: torch.nn.Module,
    recipe: str,
    *,
    steps: int = 3,
    microbatches: int = 2,
    after_step: Hook | None = None,
    before_microbatch: Hook | None = None,
    first_microbatch: Callable[[int, int], bool | None] | None = None,
) -> Run:
    """Train `model` (see the module docstring); hooks get (model, step, microbatch)."""
    torch.set_num_threads(1)
    optimizer = SGD(model)
    fp8_recipe = make_recipe(recipe)
    dtype = dtype_of(model)
    run = Run()
    for step in range(steps):
        for mb in range(microbatches):
            if before_microbatch is not None:
                before_microbatch(model, step, mb)
            first = first_microbatch(step, mb) if first_microbatch else mb == 0
            x = batch(step, mb, dtype)
            with te_twin.autocast(fp8_recipe):
                y = forward(model, x, first)
            loss = (y.float() ** 2).mean() / microbatches
            loss.backward()
            run.losses.append(loss.detach().clone())
            assert x.grad is not None, "the dgrad GEMM ran"
            run.input_grads.append(x.grad.detach().clone())
        run.grads.append({n: p.grad.detach().clone() for n, p in optimizer.params if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad()
        if after_step is not None:
            after_step(model, step, microbatches - 1)
    run.weights = {n: _plain(p) for n, p in model.named_parameters()}
    return run


def workspaces(model: torch.nn.Module) -> dict[str, Any]:
    """Every cache entry TE's forward left: {"<layer index>.<key>": value}."""
    out = {}
    for i, layer in enumerate(layers_of(model)):
        for key, value in layer.__dict__.get("_fp8_workspaces", {}).items():
            out[f"{i}.{key}"] = value
    return out


def inner_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The plain tensors a TE value holds, found by walking its instance attributes (nested
    storages included): an oracle independent of the shim's own field list."""
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return [value]
    if depth > 4 or value is None:
        return []
    found: list[torch.Tensor] = []
    attrs = getattr(value, "__dict__", {})
    for name, item in attrs.items():
        if name == "_quantizer" or name.startswith("__"):
            continue
        if isinstance(item, (list, tuple)):
            for sub in item:
                found += inner_tensors(sub, depth + 1)
        elif isinstance(item, torch.Tensor) or hasattr(item, "__dict__"):
            if isinstance(item, torch.nn.Module) or (callable(item) and not isinstance(item, torch.Tensor)):
                continue
            found += inner_tensors(item, depth + 1)
    return found


def unique_storage_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    storages.pop(0, None)
    return sum(storages.values())
