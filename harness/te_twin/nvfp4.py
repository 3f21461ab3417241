"""NVFP4 (NVFP4BlockScaling, TE 2.8+, Blackwell: the twin answers as sm100 for it): `NVFP4Tensor` /
its storage class.

Sources (TransformerEngine main = 2.20.0.dev0, v2.18, v2.9; the wheels' Python of 2.9.0 and 2.20.2):
- csrc/quantizer.cpp `NVFP4Quantizer`: `create_tensor` / `convert_and_update_tensor` (row-wise data
  [..., K/2] uint8, two E2M1 values a byte; column-wise data the 2-D transpose [K, M/2]; E4M3 block
  scales as uint8, row-wise [roundup(M, 128), roundup(K/16, 4)], column-wise
  [roundup(K, 128), roundup(M/16, 4)]; one float32 amax per direction, shape [1]; both flattened
  dimensions multiples of 16), `get_scale_shape`, `quantize_impl` (amax of the input, or with RHT
  the row-wise amax of the input and the column-wise amax of RHT(input.T); RHT only for bf16
  input; a Philox state drawn from CUDA's default generator when stochastic rounding is on, one
  more for the column-wise pass of the unfused RHT path from 2.12);
- from 2.18 (`nvfp4_emits_gemm_swizzled_scales`): with the quantizer's `optimize_for_gemm` the
  kernel writes the scales in cuBLAS's swizzled layout when the shape fits the fused kernels
  (RHT: rows % 64, cols % 128; 2-D without RHT: rows and cols % 128), else compact; the
  releases 2.12 - 2.16, whose quantizer also has `optimize_for_gemm`, were not read (the 2.18
  rule is applied). 2.9 has no swizzled-scale field: compact scales, the GEMM swizzles them;
- common/cast/nvfp4/core_nvfp4.cuh, quantize_transpose_nvfp4.cuh: the global encode scale
  S_enc = 448 * 6 / amax (float32 max if it overflows, 1 for a zero amax), S_dec = 1 / S_enc; per
  16-element block (1 x 16 along the row, or a 16 x 16 tile with `with_2d_quantization`) the
  decode scale e4m3(block_amax * (S_enc / 6)) (satfinite), the values multiplied by
  min(1 / (scale * S_dec), float32 max) and converted to E2M1 (cvt.rn.satfinite, or cvt.rs with
  random bits under stochastic rounding); element 2i in the low nibble of byte i, 2i+1 in the high
  nibble (reference_nvfp4.py `cast_to_fp4x2` in the 2.20.2 wheel);
- hadamard_transform/*.cu and the wheel's nvfp4_tensor.py `get_rht_matrix`: the column-wise
  operand is RHT(x.T): every 16 consecutive entries of a row of x.T times the quantizer's
  `rht_matrix` (diag(signs) @ H16 / 4, in bf16), the result in bf16 (the unfused path writes a bf16
  temporary), then quantized as rows;
- dequantize_nvfp4.cuh: value * (scale * amax * (1 / (6 * 448)));
- cublaslt_gemm.cu `CanonicalizeGemmInput` (NVFP4 branch), recipe/nvfp4.cu
  `compute_nvfp4_per_tensor_scale_kernel`: TN only: A's row-wise data and amax when transposed,
  else its column-wise data and column-wise amax; B's row-wise data and amax when not transposed,
  else its column-wise copy; a missing one raises; cuBLAS multiplies the block-scaled values and
  scales the result by alpha * amax_A * amax_B / (6 * 6 * 448 * 448).
Not twinned (they raise): row-scaled NVFP4 (`row_scaled_nvfp4`) and 4over6 block selection
(2.20); amax reduction across ranks (`with_amax_reduction`) has one rank here and is a no-op.
Stochastic rounding on the twin: the Philox state TE draws from CUDA's generator is one draw from
that generator (the CPU's here), which seeds the uniform numbers of the pass: two runs from the same
seed round alike, bit for bit; the GPU's own random bits are not reproduced.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, mxfp8, storage

BLOCK = 16
FP4_MAX = 6.0
E4M3_MAX = 448.0
FLOAT32_MAX = dtypes.FLOAT32_MAX
# E2M1 codes 0-7 (sign bit 8 for the negatives): 0, 0.5, 1, 1.5, 2, 3, 4, 6
MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)
VALUES = torch.cat([MAGNITUDES, -MAGNITUDES])


def _roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def _dims(shape: list[int]) -> tuple[int, int]:
    k = shape[-1] if shape else 1
    m = 1
    for s in shape[:-1]:
        m *= s
    if m % BLOCK:
        raise RuntimeError(f"First dim for NVFP4 must be divisible by {BLOCK} (got shape={list(shape)})")
    if k % BLOCK:
        raise RuntimeError(f"NVFP4 requires tensor dims that are divisible by {BLOCK} (got shape={list(shape)})")
    return m, k


def scale_shape(shape: list[int], columnwise: bool) -> list[int]:
    """NVFP4Quantizer::get_scale_shape."""
    m, k = _dims(shape)
    return [_roundup(k, 128), _roundup(m // BLOCK, 4)] if columnwise else [_roundup(m, 128), _roundup(k // BLOCK, 4)]


def _data_shape(shape: list[int]) -> storage.DirectionShape:
    """Row-wise: the shape with its last dimension halved; column-wise: the 2-D transpose, halved."""
    m, k = _dims(shape)
    return lambda columnwise: [k, m // 2] if columnwise else [*shape[:-1], k // 2]


def _scale_shape(shape: list[int]) -> storage.DirectionShape:
    return lambda columnwise: scale_shape(shape, columnwise)


def _check(quantizer: Any) -> None:
    if getattr(quantizer, "row_scaled_nvfp4", False):
        raise NotImplementedError("the CPU twin has no row-scaled NVFP4 (row_scaled_nvfp4)")
    if getattr(quantizer, "nvfp4_use_4over6", False):
        raise NotImplementedError("the CPU twin has no NVFP4 4over6 block selection (nvfp4_use_4over6)")


def swizzled(quantizer: Any, shape: list[int]) -> bool:
    """nvfp4_emits_gemm_swizzled_scales (2.18+; the twin is always an sm100)."""
    if not getattr(quantizer, "optimize_for_gemm", False):
        return False
    rows, cols = _dims(shape)
    if quantizer.with_rht:
        return rows % 64 == 0 and cols % 128 == 0
    return bool(quantizer.with_2d_quantization) and rows % 128 == 0 and cols % 128 == 0


def _amax_buffers(quantizer: Any) -> dict[str, Any]:
    return {
        "amax_rowwise": storage.empty([1], torch.float32) if quantizer.rowwise_usage else None,
        "amax_columnwise": storage.empty([1], torch.float32) if quantizer.columnwise_usage else None,
    }


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype, device: Any = None) -> Any:
    """NVFP4Quantizer::create_tensor."""
    _check(quantizer)
    fields = storage.new_direction_buffers(quantizer, _data_shape(shape), _scale_shape(shape), torch.uint8)
    fields.update(_amax_buffers(quantizer))
    fields.update(
        fp4_dtype=storage.python_dtype(dtypes.value(quantizer.dtype)),
        quantizer=quantizer,
        with_gemm_swizzled_scales=swizzled(quantizer, shape),
    )
    return storage.new_quantized("NVFP4Tensor", quantizer, shape, fake_dtype, fields)


def logical_shape(tensor: Any) -> list[int]:
    """convert_shape_back_from_fp4: the row-wise bytes' shape with the last dimension doubled, else
    the column-wise [K, M/2] rotated back to [M, K]."""
    if tensor._rowwise_data is not None:
        shape = list(tensor._rowwise_data.shape)
        return [*shape[:-1], shape[-1] * 2]
    k, half_m = tensor._columnwise_data.shape
    return [half_m * 2, k]


def coerce(quantizer: Any, tensor: Any) -> None:
    """NVFP4Quantizer::convert_and_update_tensor: each direction's data, scales and amax allocated
    or dropped by the quantizer's usages."""
    _check(quantizer)
    if tensor._rowwise_data is None and tensor._columnwise_data is None:
        raise RuntimeError("NVFP4Tensor has no data.")
    shape = logical_shape(tensor)
    if hasattr(tensor, "_with_gemm_swizzled_scales"):
        tensor._with_gemm_swizzled_scales = swizzled(quantizer, shape)
    storage.update_direction_buffers(tensor, quantizer, _data_shape(shape), _scale_shape(shape), torch.uint8)
    for direction in ("rowwise", "columnwise"):
        name = f"_amax_{direction}"
        if not getattr(quantizer, f"{direction}_usage"):
            setattr(tensor, name, None)
        elif getattr(tensor, name) is None:
            setattr(tensor, name, storage.empty([1], torch.float32))


# --- the E2M1 codec -------------------------------------------------------------------------


def encode_e2m1(values: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """E2M1 codes (uint8, 0-15) of float32 values, saturated to +-6 (satfinite; NaN becomes 6):
    round to nearest, ties to the even code, or with `uniform` (numbers in [0, 1), one per value)
    stochastically: up to the next code with probability (|v| - lower) / (upper - lower)."""
    v = values.float().contiguous()
    negative = torch.signbit(v) & ~torch.isnan(v)
    mag = torch.nan_to_num(v.abs(), nan=FP4_MAX).clamp(max=FP4_MAX)
    lower = (torch.bucketize(mag, MAGNITUDES, right=True) - 1).clamp(0, 7)
    upper = (lower + 1).clamp(max=7)
    lo, hi = MAGNITUDES[lower], MAGNITUDES[upper]
    span = torch.where(upper > lower, hi - lo, torch.ones((), dtype=torch.float32))
    frac = (mag - lo) / span
    if uniform is None:
        up = (frac > 0.5) | ((frac == 0.5) & (lower % 2 == 1))
    else:
        up = uniform.reshape(v.shape) < frac
    code = torch.where(up & (upper > lower), upper, lower)
    return (code | (negative.to(code.dtype) << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The float32 values of E2M1 codes (uint8, 0-15)."""
    return VALUES[codes.long()]


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[R, C] codes -> [R, C/2] bytes: element 2i in the low nibble, 2i+1 in the high one."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack(data: torch.Tensor) -> torch.Tensor:
    """[R, C/2] bytes -> [R, C] codes."""
    rows, half = data.shape
    return torch.stack([data & 0x0F, data >> 4], dim=-1).reshape(rows, half * 2)


# --- scales ---------------------------------------------------------------------------------


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """compute_global_encode_scaling_factor_FP4: 448 * 6 / amax, float32 max if it overflows, 1
    for a zero amax (or a zero scale)."""
    a = amax.reshape(()).float()
    scale = torch.tensor(E4M3_MAX * FP4_MAX, dtype=torch.float32) / a
    scale = torch.clamp(scale, max=FLOAT32_MAX)
    one = torch.ones((), dtype=torch.float32)
    return torch.where((a == 0) | (scale == 0), one, scale)


def _block_amax(x: torch.Tensor, two_d: bool) -> torch.Tensor:
    """max|x| per 1 x 16 block ([R, C/16]), or per 16 x 16 tile repeated on each of its rows."""
    rows, cols = x.shape
    a = x.abs().float()
    a = torch.where(torch.isnan(a), torch.zeros((), dtype=torch.float32), a)
    if two_d:
        tiles = a.reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).amax(dim=(1, 3))
        return tiles.repeat_interleave(BLOCK, 0)
    return a.reshape(rows, cols // BLOCK, BLOCK).amax(dim=2)


def quantize_rows(
    x: torch.Tensor, amax: torch.Tensor, two_d: bool, uniform: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One direction: x [R, C] along its rows -> (packed data [R, C/2], E4M3 scale bytes [R, C/16])."""
    s_enc = global_encode_scale(amax)
    s_dec = (1.0 / s_enc.double()).float()
    fp4_max_inv = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)
    decode = _block_amax(x, two_d) * (s_enc * fp4_max_inv)
    scale_bytes = dtypes.cast_fp8(torch.clamp(decode, max=FLOAT32_MAX), 1.0, dtypes.E4M3)
    scale = dtypes.decode_fp8(scale_bytes, dtypes.E4M3)
    encode = torch.clamp(torch.reciprocal(scale * s_dec), max=FLOAT32_MAX)
    scaled = x.float() * encode.repeat_interleave(BLOCK, 1)
    return pack(encode_e2m1(scaled, uniform)), scale_bytes


def rht(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """The random Hadamard transform of x [R, C] along its rows, 16 entries at a time, in bf16."""
    rows, cols = x.shape
    if cols % BLOCK:
        raise RuntimeError(f"the Hadamard transform needs rows of a multiple of {BLOCK} entries (got {cols})")
    out = x.float().reshape(-1, BLOCK) @ matrix.float().reshape(BLOCK, BLOCK)
    return out.reshape(rows, cols).to(torch.bfloat16)


def _uniform(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _philox_seed() -> int:
    """init_philox_state(CUDA's default generator): one draw from it (the CPU's generator here)."""
    return int(torch.randint(0, 2**62, (1,), generator=torch.default_generator))


def _write_scales(target: torch.Tensor, scale_bytes: torch.Tensor, swizzle: bool) -> None:
    full = torch.zeros(target.shape, dtype=torch.uint8)
    full[: scale_bytes.shape[0], : scale_bytes.shape[1]] = scale_bytes
    target.view(-1).copy_((mxfp8.swizzle(full) if swizzle else full).reshape(-1))


def quantize(x: torch.Tensor, quantizer: Any, out: Any, noop: torch.Tensor | None) -> None:
    """NVFP4Quantizer::quantize into `out` (both directions the output holds)."""
    _check(quantizer)
    if storage.nothing_to_quantize(x, noop):
        return
    with_rht = bool(quantizer.with_rht)
    if with_rht and x.dtype != torch.bfloat16:
        raise RuntimeError("RHT is only supported for bfloat16 input")
    if with_rht and not quantizer.with_post_rht_amax:
        raise RuntimeError("Pre-RHT amax is not supported yet")
    matrix = storage.to_2d(x)
    two_d = bool(quantizer.with_2d_quantization)
    swizzle = bool(getattr(out, "_with_gemm_swizzled_scales", False))
    rounding = bool(quantizer.stochastic_rounding)
    seed = _philox_seed() if rounding else 0
    amax = dtypes.amax(matrix).reshape(1)
    if out._rowwise_data is not None:
        uniform = _uniform(seed, tuple(matrix.shape)) if rounding else None
        data, scales = quantize_rows(matrix, amax, two_d, uniform)
        out._rowwise_data.copy_(data.reshape(out._rowwise_data.shape))
        _write_scales(out._rowwise_scale_inv, scales, swizzle)
        out._amax_rowwise.copy_(amax)
    if out._columnwise_data is not None:
        source = matrix.t()
        column_amax = amax
        if with_rht:
            source = rht(source, quantizer.rht_matrix)
            column_amax = dtypes.amax(source).reshape(1)
        uniform = _uniform(seed + 1, tuple(source.shape)) if rounding else None
        data, scales = quantize_rows(source, column_amax, two_d, uniform)
        out._columnwise_data.copy_(data.reshape(out._columnwise_data.shape))
        _write_scales(out._columnwise_scale_inv, scales, swizzle)
        out._amax_columnwise.copy_(column_amax)


def _block_values(tensor: Any, columnwise: bool) -> torch.Tensor:
    """One direction's values times their E4M3 block scales, without the per-tensor scale:
    [M, K] row-wise, [K, M] column-wise (what cuBLAS multiplies before alpha)."""
    data = tensor._columnwise_data if columnwise else tensor._rowwise_data
    codes = unpack(storage.to_2d(data))
    rows, cols = codes.shape
    scales = tensor._columnwise_scale_inv if columnwise else tensor._rowwise_scale_inv
    if getattr(tensor, "_with_gemm_swizzled_scales", False):
        scales = mxfp8.unswizzle(scales)
    block = dtypes.decode_fp8(scales[:rows, : cols // BLOCK].contiguous(), dtypes.E4M3)
    return decode_e2m1(codes) * block.repeat_interleave(BLOCK, 1)


def _amax_of(tensor: Any, columnwise: bool, name: str) -> torch.Tensor:
    amax = tensor._amax_columnwise if columnwise else tensor._amax_rowwise
    if amax is None:
        raise RuntimeError(f"amax_{name}_ptr is null")
    return amax.reshape(-1)[0].float()


def gemm_operand(t: Any, transposed: bool, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(op(t) as cuBLAS multiplies it, the per-tensor amax it reads) for an NVFP4 operand."""
    use_rowwise = transposed if name == "A" else not transposed
    if use_rowwise and t._rowwise_data is None:
        raise RuntimeError(f"Input {name} is missing row-wise usage")
    if not use_rowwise and t._columnwise_data is None:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    values = _block_values(t, columnwise=not use_rowwise)  # [rows of the direction, k]
    amax = _amax_of(t, not use_rowwise, name)
    # TN: both are read with the contraction dimension last; op(A) is [k, n], op(B) [m, k]
    return (values.t() if name == "A" else values), amax


def per_tensor_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor) -> torch.Tensor:
    """compute_nvfp4_per_tensor_scale_kernel (alpha_in = 1)."""
    factor_inv = torch.tensor(1.0 / (FP4_MAX * FP4_MAX * E4M3_MAX * E4M3_MAX), dtype=torch.float32)
    return amax_a * amax_b * factor_inv


def dequantize(tensor: Any, otype: torch.dtype) -> torch.Tensor:
    """dequantize_fp4_kernel (row-wise data; TE's Python refuses column-wise-only tensors)."""
    if tensor._rowwise_data is None:
        raise NotImplementedError("Dequantizing column-wise NVFP4 data is not implemented yet!")
    codes = unpack(storage.to_2d(tensor._rowwise_data))
    rows, cols = codes.shape
    scales = tensor._rowwise_scale_inv
    if getattr(tensor, "_with_gemm_swizzled_scales", False):
        scales = mxfp8.unswizzle(scales)
    block = dtypes.decode_fp8(scales[:rows, : cols // BLOCK].contiguous(), dtypes.E4M3)
    factor_inv = torch.tensor(1.0 / (FP4_MAX * E4M3_MAX), dtype=torch.float32)
    final = block * tensor._amax_rowwise.reshape(-1)[0].float() * factor_inv
    values = decode_e2m1(codes) * final.repeat_interleave(BLOCK, 1)
    return values.reshape(logical_shape(tensor)).to(otype)
