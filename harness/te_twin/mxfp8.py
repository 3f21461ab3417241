"""MXFP8 (MXFP8BlockScaling, Blackwell: the twin answers as sm100 for it): `MXFP8Tensor` / its
storage class.

Sources (TransformerEngine main = 2.20.0.dev0, v2.9):
- csrc/quantizer.cpp `MXFP8Quantizer`: `create_tensor` (row-wise and column-wise data both in
  the tensor's own shape, uint8; E8M0 scale-inverses, one byte per 32 values: row-wise
  [roundup(M, 128), roundup(K/32, 4)] over 1x32 blocks along K, column-wise
  [roundup(M/32, 4), roundup(K, 128)] over 32x1 blocks along M; dimensions must be multiples of
  32), `get_scale_shape`, `convert_and_update_tensor`; 2.20 builds the scales in cuBLAS's
  swizzled layout when the quantizer has `optimize_for_gemm` (`with_gemm_swizzled_scales`);
- common/cast/mxfp8 and util/ptx: per block, the E8M0 exponent of amax / fp8_max rounded up
  (float_to_e8m0, satfinite), the values multiplied by its reciprocal power of two
  (exp2f_rcp) and cast to FP8;
- cublaslt_gemm.cu (MXFP8 branch): A's row-wise data when transposed, else its column-wise
  data; B's row-wise data when not transposed, else its column-wise data; a missing one raises.
- Swizzled scales: cuBLAS's block-scaling-factor layout (128 x 4 tiles of scale bytes, each tile
  stored as 32 rows of 16 bytes: byte (r % 32) * 16 + (r // 32) * 4 + c; tiles in row-major
  order); column-wise scales are swizzled as their transpose (K-major for the GEMM). This is
  the documented cuBLAS layout; the twin reads it back itself, so a mistake in it would not show
  in any result, only in the bytes of the scale tensor.
- Before 2.3 the GEMM expects swizzled scales and TE's Python swizzles them itself around each
  GEMM (cpp_extensions/gemm.py `swizzle_inputs`, with the extension's `rowwise_swizzle` /
  `columnwise_swizzle`, csrc/extensions/swizzle.cpp v2.1); from 2.3 the C++ GEMM swizzles
  compact scales itself (gemm.cpp `swizzle_scales_for_gemm`).
Padding entries of the scale tensors are written as 0 (the E8M0 code of 2^-127). `with_2d_quantization`
(2.20, 32x32 blocks) is not twinned and raises.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, storage
from harness.te_twin.counters import kernel

BLOCK = 32
_RCP = {k: torch.tensor(1.0 / v, dtype=torch.float32) for k, v in dtypes.FP8_MAX.items()}  # max_norm_rcp


def _roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def _dims(shape: list[int]) -> tuple[int, int]:
    k = shape[-1]
    m = 1
    for s in shape[:-1]:
        m *= s
    if k % BLOCK or m % BLOCK:
        raise RuntimeError(f"MXFP8 requires tensor dims that are divisible by {BLOCK} (got shape={list(shape)})")
    return m, k


def scale_shape(shape: list[int], columnwise: bool) -> list[int]:
    """MXFP8Quantizer::get_scale_shape."""
    m, k = _dims(shape)
    return [_roundup(m // BLOCK, 4), _roundup(k, 128)] if columnwise else [_roundup(m, 128), _roundup(k // BLOCK, 4)]


def _data_shape(shape: list[int]) -> storage.DirectionShape:
    """Both directions' data keep the tensor's own shape."""
    return lambda columnwise: shape


def _scale_shape(shape: list[int]) -> storage.DirectionShape:
    return lambda columnwise: scale_shape(shape, columnwise)


def _swizzled(quantizer: Any) -> bool:
    return bool(getattr(quantizer, "optimize_for_gemm", False))


def _check(quantizer: Any) -> None:
    if getattr(quantizer, "with_2d_quantization", False):
        raise NotImplementedError("the CPU twin has no 2-D MXFP8 quantization (with_2d_quantization)")


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype, device: Any = None) -> Any:
    """MXFP8Quantizer::create_tensor."""
    _check(quantizer)
    _dims(shape)
    fields = storage.new_direction_buffers(quantizer, _data_shape(shape), _scale_shape(shape), torch.uint8)
    fields.update(
        fp8_dtype=storage.python_dtype(dtypes.value(quantizer.dtype)),
        quantizer=quantizer,
        with_gemm_swizzled_scales=_swizzled(quantizer),
    )
    return storage.new_quantized("MXFP8Tensor", quantizer, shape, fake_dtype, fields)


def logical_shape(tensor: Any) -> list[int]:
    data = tensor._rowwise_data if tensor._rowwise_data is not None else tensor._columnwise_data
    return list(data.shape)


def coerce(quantizer: Any, tensor: Any) -> None:
    """MXFP8Quantizer::convert_and_update_tensor: each direction allocated or dropped by usage."""
    _check(quantizer)
    if tensor._rowwise_data is None and tensor._columnwise_data is None:
        raise RuntimeError("MXFP8Tensor has no data.")
    shape = logical_shape(tensor)
    storage.update_direction_buffers(tensor, quantizer, _data_shape(shape), _scale_shape(shape), torch.uint8)
    if hasattr(tensor, "_with_gemm_swizzled_scales"):
        tensor._with_gemm_swizzled_scales = _swizzled(quantizer)


def e8m0(values: torch.Tensor) -> torch.Tensor:
    """float_to_e8m0 (util/ptx_arch_spec.cuh): the biased exponent rounded up, satfinite; NaN 255,
    inf 254, 0 -> 0. For non-negative float32 values."""
    v = values.float().contiguous()
    bits = v.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + up.to(torch.int32)
    e = torch.where(v == 0, torch.zeros_like(e), e)
    e = torch.where(torch.isinf(v), torch.full_like(e, 0xFE), e)
    e = torch.where(torch.isnan(v), torch.full_like(e, 0xFF), e)
    return e.to(torch.uint8)


def reciprocal(e: torch.Tensor) -> torch.Tensor:
    """exp2f_rcp<float> (util/ptx.cuh): 2^(127 - e) as float32; 255 -> NaN, 254 -> 2^-127."""
    ei = e.to(torch.int32)
    out = ((254 - ei).clamp(min=0) << 23).view(torch.float32)
    out = torch.where(ei == 254, torch.tensor(2.0**-127, dtype=torch.float32), out)
    return torch.where(ei == 255, torch.tensor(float("nan"), dtype=torch.float32), out)


def decode_scale(e: torch.Tensor) -> torch.Tensor:
    """The value of E8M0 codes: 2^(e - 127); 255 is NaN."""
    out = torch.pow(torch.tensor(2.0, dtype=torch.float32), e.float() - 127.0)
    return torch.where(e == 255, torch.tensor(float("nan")), out)


def _block_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    m, k = x.shape
    a = x.abs().float()
    a = torch.where(torch.isnan(a), torch.zeros((), dtype=torch.float32), a)
    return a.reshape(m // rows, rows, k // cols, cols).amax(dim=(1, 3))


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """Compact [R, C] scale bytes (R % 128 == 0, C % 4 == 0) -> cuBLAS's swizzled layout."""
    r, c = scales.shape
    tiles = scales.reshape(r // 128, 4, 32, c // 4, 4)  # [tile_m, r // 32, r % 32, tile_k, col]
    return tiles.permute(0, 3, 2, 1, 4).reshape(r, c).contiguous()


def unswizzle(scales: torch.Tensor) -> torch.Tensor:
    r, c = scales.shape
    tiles = scales.reshape(r // 128, c // 4, 32, 4, 4)  # [tile_m, tile_k, r % 32, r // 32, col]
    return tiles.permute(0, 3, 2, 1, 4).reshape(r, c).contiguous()


def _write_scales(target: torch.Tensor, codes: torch.Tensor, columnwise: bool, swizzled: bool) -> None:
    full = torch.zeros(target.shape, dtype=torch.uint8)
    full[: codes.shape[0], : codes.shape[1]] = codes
    if swizzled:  # in memory order: the swizzle of the scales (of their transpose, column-wise)
        full = swizzle(full.t().contiguous()) if columnwise else swizzle(full)
    target.view(-1).copy_(full.reshape(-1))


def _gemm_expects_swizzled() -> bool:
    import sys

    return sys.modules["transformer_engine_torch"].__twin_release__ < (2, 3)


def _read_scales(tensor: Any, columnwise: bool, for_gemm: bool = False) -> torch.Tensor:
    scales = tensor._columnwise_scale_inv if columnwise else tensor._rowwise_scale_inv
    if getattr(tensor, "_with_gemm_swizzled_scales", False) or (for_gemm and _gemm_expects_swizzled()):
        rows, cols = scales.shape
        scales = unswizzle(scales.reshape(cols, rows)).t() if columnwise else unswizzle(scales)
    return scales


def quantize(x: torch.Tensor, quantizer: Any, out: Any, noop: torch.Tensor | None) -> None:
    """nvte_quantize for MXFP8 into `out` (both directions the output holds)."""
    if storage.nothing_to_quantize(x, noop):
        return
    fp8 = dtypes.value(quantizer.dtype)
    matrix = storage.to_2d(x)
    swizzled = bool(getattr(out, "_with_gemm_swizzled_scales", False))
    if out._rowwise_data is not None:
        codes = e8m0(_block_amax(matrix, 1, BLOCK) * _RCP[fp8])  # [M, K/32]
        per = reciprocal(codes).repeat_interleave(BLOCK, 1)
        out._rowwise_data.copy_(dtypes.cast_fp8(matrix, per, fp8).reshape(out._rowwise_data.shape))
        _write_scales(out._rowwise_scale_inv, codes, False, swizzled)
    if out._columnwise_data is not None:
        codes = e8m0(_block_amax(matrix, BLOCK, 1) * _RCP[fp8])  # [M/32, K]
        per = reciprocal(codes).repeat_interleave(BLOCK, 0)
        out._columnwise_data.copy_(dtypes.cast_fp8(matrix, per, fp8).reshape(out._columnwise_data.shape))
        _write_scales(out._columnwise_scale_inv, codes, True, swizzled)


def _decode(tensor: Any, columnwise: bool, for_gemm: bool = False) -> torch.Tensor:
    """The float32 values [M, K] of one direction."""
    data = tensor._columnwise_data if columnwise else tensor._rowwise_data
    values = storage.to_2d(dtypes.decode_fp8(data, storage.fp8_dtype_of(tensor)))
    m, k = values.shape
    scales = _read_scales(tensor, columnwise, for_gemm)
    if columnwise:
        per = decode_scale(scales[: m // BLOCK, :k]).repeat_interleave(BLOCK, 0)
    else:
        per = decode_scale(scales[:m, : k // BLOCK]).repeat_interleave(BLOCK, 1)
    return values * per


def gemm_operand(t: Any, transposed: bool, name: str) -> torch.Tensor:
    """op(t) for an MXFP8 GEMM operand (see the module docstring)."""
    use_rowwise = transposed if name == "A" else not transposed
    if use_rowwise and t._rowwise_data is None:
        raise RuntimeError(f"Input {name} is missing row-wise usage")
    if not use_rowwise and t._columnwise_data is None:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    values = _decode(t, columnwise=not use_rowwise, for_gemm=True)
    return values.t() if transposed else values


def dequantize(tensor: Any, otype: torch.dtype) -> torch.Tensor:
    columnwise = tensor._rowwise_data is None
    return _decode(tensor, columnwise).reshape(logical_shape(tensor)).to(otype)


@kernel("rowwise_swizzle")
def rowwise_swizzle(input: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """tex.rowwise_swizzle(data, scale_inv) (2.1 - 2.3, swizzle.cpp): a swizzled copy of row-wise scales."""
    return storage.output(swizzle(scale_inv.contiguous()))


@kernel("columnwise_swizzle")
def columnwise_swizzle(input: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """tex.columnwise_swizzle(data, scale_inv) (2.1 - 2.3): a swizzled copy of column-wise scales
    (the swizzle of their transpose, in memory order)."""
    rows, cols = scale_inv.shape
    return storage.output(swizzle(scale_inv.t().contiguous()).reshape(rows, cols))
