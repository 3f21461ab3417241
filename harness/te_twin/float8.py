"""Per-tensor FP8 (DelayedScaling, Float8CurrentScaling): building, filling and reading
`Float8Tensor` / its storage class the way the extension does.

Sources (TransformerEngine, main = 2.20.0.dev0 and v2.9; same semantics unless noted):
- csrc/quantizer.cpp `Float8Quantizer` / `Float8CurrentScalingQuantizer`: `create_tensor`
  (data unless only column-wise use on Hopper, a transpose for column-wise use on Hopper,
  scale_inv = 1 / scale for delayed scaling before 2.9, else uninitialised), `convert_and_update_tensor`
  (allocates or drops `_data` / `_transpose` to match the quantizer's usages, sets `_transpose_invalid`), `quantize`;
- common/cast (nvte_quantize_v2): cast with the quantizer's scale, amax = max(amax, max|x|)
  (atomic max into the delayed-scaling amax slot), scale_inv = 1 / scale, a transpose written
  when the output has one, everything skipped when the no-op flag is 1;
- common/recipe/current_scaling.cu: current scaling computes amax, then the scale
  (recipe_common.cuh compute_scale_from_amax), then casts. 2.9's C++ keeps them in the
  quantizer's own `amax` / `scale` tensors; 2.20's quantizer has none (temporaries).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, storage


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype, device: Any = None) -> Any:
    """Float8Quantizer / Float8CurrentScalingQuantizer::create_tensor."""
    non_tn = storage.non_tn_fp8_gemm_supported()
    with_data = bool(quantizer.rowwise_usage) or non_tn
    with_transpose = bool(quantizer.columnwise_usage) and not non_tn
    data = storage.empty(shape, torch.uint8) if with_data else None
    transpose = storage.empty(storage.transpose_shape(shape), torch.uint8) if with_transpose else None
    if storage.quantizer_kind(quantizer) == "delayed" and _scale_inv_from_scale():
        scale_inv = storage.output(torch.reciprocal(quantizer.scale))  # at::reciprocal(scale)
    else:
        scale_inv = storage.empty([1], torch.float32)  # at::empty: written by the quantize that follows
    fields = {
        "data": data,
        "fp8_scale_inv": scale_inv,
        "fp8_dtype": storage.python_dtype(dtypes.value(quantizer.dtype)),
        "data_transpose": transpose,
        "quantizer": quantizer,
    }
    return storage.new_quantized("Float8Tensor", quantizer, shape, fake_dtype, fields)


# From 2.9 `Float8Quantizer::create_tensor(shape, dtype)` allocates the scale-inverse uninitialised
# (`at::empty({1})`) and passes it on; before, `create_tensor` filled it with `at::reciprocal(scale)`.
SCALE_INV_EMPTY_FROM = (2, 9)


def _scale_inv_from_scale() -> bool:
    from harness import te_twin

    return te_twin.release() < SCALE_INV_EMPTY_FROM


def coerce(quantizer: Any, tensor: Any) -> None:
    """Float8Quantizer::convert_and_update_tensor: give `tensor` the buffers the quantizer's usages
    need on this GPU, drop the others, and mark the transpose valid exactly when it is kept."""
    non_tn = storage.non_tn_fp8_gemm_supported()
    need_data = bool(quantizer.rowwise_usage) or non_tn
    need_transpose = bool(quantizer.columnwise_usage) and not non_tn
    if not (need_data or need_transpose):
        raise RuntimeError("Invalid usages for Float8Quantizer.")
    data, transpose = tensor._data, tensor._transpose
    if data is None and transpose is None:
        raise RuntimeError("Float8Tensor has no data.")
    if transpose is not None:
        shape = [*transpose.shape[1:], transpose.shape[0]]
        if data is not None and list(data.shape) != shape:
            raise RuntimeError(
                f"FP8 data (shape={list(data.shape)}) and transpose (shape={list(transpose.shape)}) do not match"
            )
    else:
        shape = list(data.shape)
    if data is not None and not need_data:
        tensor._data = None
    elif data is None and need_data:
        tensor._data = storage.empty(shape, torch.uint8)
    if transpose is not None and not need_transpose:
        tensor._transpose = None
    elif transpose is None and need_transpose:
        tensor._transpose = storage.empty(storage.transpose_shape(shape), torch.uint8)
    tensor._transpose_invalid = not need_transpose
    tensor._fp8_dtype = storage.python_dtype(dtypes.value(quantizer.dtype))


def quantize(x: torch.Tensor, quantizer: Any, out: Any, noop: torch.Tensor | None) -> None:
    """Quantizer::quantize for per-tensor scaling into `out` (already coerced or freshly built)."""
    if storage.nothing_to_quantize(x, noop):
        return
    if out._data is None and out._transpose is not None:
        raise NotImplementedError(
            "Columnwise-only per-tensor FP8 quantization is not implemented; "
            "the cast-transpose kernel requires rowwise output storage."
        )
    fp8 = dtypes.value(quantizer.dtype)
    kind = storage.quantizer_kind(quantizer)
    if kind == "delayed":
        scale = quantizer.scale.reshape(-1)[0:1].float()
        quantizer.amax.copy_(torch.maximum(quantizer.amax, dtypes.amax(x).reshape(quantizer.amax.shape)))
    else:
        # 2.9 - 2.19 `use_existing_amax` (cast.cpp): the quantizer's amax, already computed, is used
        existing = getattr(quantizer, "use_existing_amax", False)
        a = quantizer.amax.reshape(-1)[0].float() if existing else dtypes.amax(x)
        value = dtypes.scale_from_amax(
            float(a), dtypes.FP8_MAX[fp8], quantizer.force_pow_2_scales, quantizer.amax_epsilon
        )
        scale = torch.tensor([value], dtype=torch.float32)
        if isinstance(getattr(quantizer, "scale", None), torch.Tensor):  # 2.9 - 2.19: the quantizer's own buffers
            quantizer.amax.fill_(float(a))
            quantizer.scale.fill_(value)
    out._scale_inv.copy_(torch.reciprocal(scale).reshape(out._scale_inv.shape))
    encoded = dtypes.cast_fp8(x, scale, fp8)
    if out._data is not None:
        out._data.copy_(encoded.reshape(out._data.shape))
    if out._transpose is not None and not out._transpose_invalid:
        out._transpose.copy_(storage.to_2d(encoded).t().reshape(out._transpose.shape))


def dequantize(tensor: Any, otype: torch.dtype) -> torch.Tensor:
    """nvte_dequantize for a per-tensor FP8 value: data * scale_inv, in the requested type."""
    if tensor._data is None:
        raise RuntimeError("Float8Tensor has no row-wise data to dequantize")
    values = dtypes.decode_fp8(tensor._data, storage.fp8_dtype_of(tensor)) * tensor._scale_inv.reshape(-1)[0]
    return values.to(otype)


def transpose(data: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_transpose (csrc/extensions/transpose.cpp): the 2-D transpose of FP8 bytes, in `out` if
    given, else a new tensor of the transpose shape."""
    shape = storage.transpose_shape(list(data.shape))
    if out is None:
        out = storage.empty(shape, torch.uint8)
    out.copy_(storage.to_2d(data.view(torch.uint8)).t().reshape(out.shape))
    return out
