"""The extension's cast kernels: quantize, dequantize, empty quantized tensors, transposes,
bias-gradient + quantize, split quantize, amax.

Sources: csrc/extensions/cast.cpp (quantize, dequantize, create_empty_quantized_tensor,
split_quantize), csrc/extensions/bias.cpp (bgrad_quantize), csrc/extensions/transpose.cpp
(fp8_transpose), csrc/extensions/recipe.cpp (compute_amax); TransformerEngine main (2.20.0.dev0)
and v2.9. Each recipe's own layout lives in its module (float8.py, blockwise.py, mxfp8.py, nvfp4.py); this
module picks one by the quantizer's class, as `convert_quantizer` does.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, storage
from harness.te_twin.counters import kernel


def _recipe(kind: str | None) -> Any:
    import importlib

    module = {"delayed": "float8", "current": "float8", "block": "blockwise", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}.get(
        kind or ""
    )
    if module is not None:
        return importlib.import_module(f"harness.te_twin.{module}")
    raise NotImplementedError(f"the CPU twin of transformer_engine_torch does not quantize for {kind} quantizers")


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype) -> Any:
    """`convert_quantizer(q)->create_tensor(shape, dtype)`: a new output (a plain tensor when there
    is no quantizer: NoneQuantizer)."""
    kind = storage.quantizer_kind(quantizer)
    if kind is None:
        return storage.empty(shape, fake_dtype)
    return _recipe(kind).create(quantizer, list(shape), fake_dtype)


def quantize_into(x: torch.Tensor, quantizer: Any, out: Any, noop: torch.Tensor | None = None) -> Any:
    """Quantize `x` into `out` (a value of the quantizer's own class, coerced to its usages)."""
    recipe = _recipe(storage.quantizer_kind(quantizer))
    recipe.quantize(x.contiguous(), quantizer, out, noop)
    return out


def quantize_new(x: torch.Tensor, quantizer: Any, noop: torch.Tensor | None = None) -> Any:
    """Quantize `x` into a new output of the quantizer (the plain tensor itself without one)."""
    x = x.contiguous()
    if quantizer is None:
        return x
    out = create(quantizer, list(x.shape), x.dtype)
    return quantize_into(x, quantizer, out, noop)


@kernel("quantize")
def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop: torch.Tensor | None = None) -> Any:
    """tex.quantize(tensor, quantizer, output=None, noop=None) (cast.cpp `quantize`)."""
    kind = storage.quantizer_kind(quantizer)
    if kind is None:
        raise RuntimeError("NoneQuantizer does not support quantization")
    x = tensor.contiguous()
    if output is None:
        output = create(quantizer, list(x.shape), x.dtype)
    else:
        _recipe(kind).coerce(quantizer, output)
    return quantize_into(x, quantizer, output, noop)


@kernel("dequantize")
def dequantize(input: Any, otype: Any) -> torch.Tensor:
    """tex.dequantize(input, otype) (cast.cpp `dequantize`)."""
    kind = storage.family(input)
    if kind is None:
        raise RuntimeError("dequantize expects a quantized tensor")
    recipe = _recipe({"float8": "delayed"}.get(kind, kind))
    return storage.output(recipe.dequantize(input, dtypes.to_torch(otype)))


@kernel("create_empty_quantized_tensor")
def create_empty_quantized_tensor(
    quantizer: Any, shape: list[int], dtype: torch.dtype, device: Any = None, pin_memory: bool = False
) -> Any:
    """tex.create_empty_quantized_tensor (cast.cpp, 2.20): the quantizer's create_tensor."""
    return create(quantizer, list(shape), dtype)


@kernel("fp8_transpose")
def fp8_transpose(input: torch.Tensor, dtype: Any = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """tex.fp8_transpose(input, dtype, out=None) (transpose.cpp): a 2-D transpose of FP8 bytes."""
    from harness.te_twin import float8

    return float8.transpose(input, out)


@kernel("bgrad_quantize")
def bgrad_quantize(input: torch.Tensor, quantizer: Any) -> list[Any]:
    """tex.bgrad_quantize(grad_output, quantizer) -> [grad_bias, quantized grad_output] (bias.cpp):
    the bias gradient is the sum over all rows, in the input's type; the fused dbias + cast kernels
    cast the same values as a plain quantize."""
    x = input.contiguous()
    summed = storage.to_2d(x).float().sum(0) if x.numel() else torch.zeros(x.shape[-1])
    grad_bias = storage.output(summed, x.dtype)
    if quantizer is None:
        return [grad_bias, x]
    return [grad_bias, quantize_new(x, quantizer)]


@kernel("split_quantize")
def split_quantize(
    tensor: torch.Tensor, split_sections: list[int], quantizer_list: list[Any], *args: Any, **kwargs: Any
) -> list[Any]:
    """tex.split_quantize(tensor, split_sections, quantizers) (cast.cpp): split along the first
    dimension and quantize each part with its own quantizer (extra flags of later releases choose
    bulk allocation, not values)."""
    x = tensor.contiguous()
    parts = torch.split(x, list(split_sections), dim=0)
    return [quantize_new(part, q) for part, q in zip(parts, quantizer_list, strict=True)]


@kernel("compute_amax")
def compute_amax(tensor: torch.Tensor, amax: torch.Tensor) -> None:
    """tex.compute_amax(tensor, amax) (recipe.cpp): amax = max|tensor|."""
    amax.copy_(dtypes.amax(tensor).reshape(amax.shape))


@kernel("fused_multi_quantize")
def fused_multi_quantize(
    input_list: list[torch.Tensor], output_list: list[Any] | None, quantizer_list: list[Any], otype: Any
) -> list[Any]:
    """tex.fused_multi_quantize(inputs, outputs, quantizers, otype) (2.0 - 2.8, transpose.cpp):
    each input quantized with its quantizer, into its output or a new one of fake dtype `otype`
    (the multi cast-transpose kernel writes what one quantize per tensor writes)."""
    fake = dtypes.to_torch(otype)
    outputs = []
    for i, (x, q) in enumerate(zip(input_list, quantizer_list, strict=True)):
        out = create(q, list(x.shape), fake) if output_list is None else output_list[i]
        if x.numel():
            quantize_into(x, q, out)
        outputs.append(out)
    return outputs
