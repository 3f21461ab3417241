"""One measuring process of `te-offload-shim selftest` (`python -m te_offload_shim.selftest OUT`).

TE `Linear` layers are built on the GPU and run FP8 forwards with `is_first_microbatch=True` until
their caches hold the bytes asked for; then verl's offload of a chunk that is no DDP (each
parameter `param.data = param.data.to("cpu", non_blocking=True)`, `gc.collect()`,
`torch.cuda.empty_cache()`), the reload, and the next forward, as a new step's first microbatch.
The driver's and the allocator's figures are read before and after the offload; the output's
digest lets the command compare the forward after the reload across its two runs.

Whether anything clears depends only on this process's environment: with the shim active from its
start (the package is imported before torch and TE, as the `.pth` or `run` give a job), the flush
net clears at the offload's own flush; `TE_OFFLOAD_SHIM=0` makes the package a no-op. The figures
are written to OUT as JSON; where this machine cannot run it (no GPU, no TE, no FP8 on this GPU),
`cannot` says which and the exit status is 2. A figure this process cannot read (no CUDA allocator:
the CPU twin) is None, never a made-up number.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
from typing import Any

import te_offload_shim

CANNOT = 2  # exit status: this machine cannot run the selftest
TOKENS = 128  # rows of the input: FP8 GEMMs want multiples of 16
RECIPES = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling", "mxfp8": "MXFP8BlockScaling"}


class Cannot(Exception):
    """This machine cannot run the selftest; the message says why ("no GPU: ...", "no TE: ...")."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m te_offload_shim.selftest")
    parser.add_argument("out")
    parser.add_argument("--mib", type=float, default=1024.0)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--recipe", default="auto", choices=["auto", *RECIPES])
    args = parser.parse_args(argv)
    try:
        result = run(args.mib, args.hidden, args.recipe)
    except Cannot as exc:
        result = {"cannot": str(exc)}
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(result, file)
    return CANNOT if "cannot" in result else 0


def run(mib: float, hidden: int, recipe_name: str) -> dict[str, Any]:
    """Build, cache, offload and flush, reload and forward again; the figures of each step."""
    torch, te, recipe = _setting(recipe_name)
    torch.manual_seed(0)
    x = torch.randn(TOKENS, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    chunk = torch.nn.ModuleList([_linear(te, torch, hidden)])
    _forward(te, chunk, x, recipe)
    per_layer = te_offload_shim.scan([chunk]).bytes  # one layer's caches: as many layers as the size asks
    layers = max(1, math.ceil(mib * 2**20 / per_layer)) if per_layer else 1
    chunk.extend(_linear(te, torch, hidden) for _ in range(layers - 1))
    _forward(te, chunk, x, recipe)
    gc.collect()
    torch.cuda.empty_cache()  # a clean start; every weight is on the device, so nothing clears here
    caches = te_offload_shim.scan([chunk])
    before = _figures(torch)
    offload([chunk])
    after = _figures(torch)
    left = te_offload_shim.scan([chunk])
    for param in chunk.parameters():  # verl's load_megatron_model_to_gpu for a chunk that is no DDP
        param.data = param.data.to("cuda", non_blocking=True)
    status = te_offload_shim.status()
    return {
        "te": _te_version(),
        "gpu": torch.cuda.get_device_name(),
        "recipe": type(recipe).__name__,
        "layers": len(chunk),
        "hidden": hidden,
        "caches": {"entries": caches.entries, "bytes": caches.bytes},
        "left": {"entries": left.entries, "bytes": left.bytes},
        "before": before,
        "after": after,
        "output": _digest(torch, _forward(te, chunk, x, recipe)),
        "shim": {"enabled": status["enabled"], "net": status["net"]["state"], "detail": status["net"]["detail"]},
        "net_bytes": status["net"]["bytes"],
    }


def offload(models: list[Any]) -> None:
    """verl's `offload_megatron_model_to_cpu` for chunks that are no DDP (0.4 - 0.8): every parameter
    to the CPU, then gc and the allocator flush, where the net clears what has left the device."""
    import torch

    for chunk in models:
        for param in chunk.parameters():
            param.data = param.data.to("cpu", non_blocking=True)
    gc.collect()
    torch.cuda.empty_cache()


def _setting(recipe_name: str) -> tuple[Any, Any, Any]:
    """(torch, transformer_engine.pytorch, the recipe), or Cannot saying what is missing here."""
    try:
        import torch
    except ImportError as exc:
        raise Cannot(f"no torch: {exc}") from None
    if not torch.cuda.is_available():
        raise Cannot(f"no GPU: torch {torch.__version__} sees no CUDA device")
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as recipes
    except Exception as exc:  # ImportError, or OSError from its compiled libraries
        raise Cannot(f"no TE: transformer_engine.pytorch does not import here ({type(exc).__name__}: {exc})") from None
    fp8, fp8_why = _supported(te, "is_fp8_available")
    mxfp8, mxfp8_why = _supported(te, "is_mxfp8_available")
    if recipe_name == "auto":  # the block-scaled recipe where TE says this GPU has it (sm100), else per-tensor
        recipe_name = "mxfp8" if mxfp8 else "delayed"
    ok, why = (mxfp8, mxfp8_why) if recipe_name == "mxfp8" else (fp8, fp8_why)
    if not ok:
        raise Cannot(f"no FP8 on this GPU: {RECIPES[recipe_name]}: {why or 'TE says it is not supported'}")
    kind = getattr(recipes, RECIPES[recipe_name], None)
    if kind is None:
        raise Cannot(f"no FP8 recipe: TE {_te_version()} has no {RECIPES[recipe_name]}")
    return torch, te, kind()


def _supported(te: Any, name: str) -> tuple[bool, str]:
    """TE's own answer for this GPU: `te.is_fp8_available(return_reason=True)` (2.9+), else
    `FP8GlobalStateManager`'s."""
    check = getattr(te, name, None)
    if check is not None:
        return check(return_reason=True)  # type: ignore[no-any-return]
    from transformer_engine.pytorch.fp8 import FP8GlobalStateManager

    return getattr(FP8GlobalStateManager, name)()  # type: ignore[no-any-return]


def _te_version() -> str | None:
    import sys

    return getattr(sys.modules.get("transformer_engine"), "__version__", None)


def _linear(te: Any, torch: Any, hidden: int) -> Any:
    return te.Linear(hidden, hidden, bias=False, params_dtype=torch.bfloat16, device="cuda")


def _forward(te: Any, chunk: Any, x: Any, recipe: Any) -> list[Any]:
    """Each layer's FP8 forward, a step's first microbatch: TE quantizes the weight into its cache
    (with the column-wise copy that a backward needs, since the input requires a gradient)."""
    autocast = getattr(te, "autocast", None)
    scope = autocast(recipe=recipe) if autocast else te.fp8_autocast(enabled=True, fp8_recipe=recipe)
    with scope:
        return [layer(x, is_first_microbatch=True) for layer in chunk]


def _digest(torch: Any, outputs: list[Any]) -> str:
    """The outputs' bytes, hashed: two processes' forwards are bit-identical when their digests are."""
    digest = hashlib.sha256()
    for out in outputs:
        digest.update(out.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def _figures(torch: Any) -> dict[str, int | None]:
    """The driver's free memory and the allocator's allocated and reserved bytes; None where this
    process has no CUDA allocator (no CUDA context: the CPU twin)."""
    if not torch.cuda.is_initialized():
        return {"free": None, "allocated": None, "reserved": None}
    torch.cuda.synchronize()
    free, _total = torch.cuda.mem_get_info()
    return {"free": free, "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
