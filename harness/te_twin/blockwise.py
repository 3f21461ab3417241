"""FP8 block scaling (Float8BlockScaling): `Float8BlockwiseQTensor` / its storage class.

Sources (TransformerEngine main = 2.20.0.dev0, v2.9, v2.4):
- csrc/quantizer.cpp `Float8BlockQuantizer`: `create_tensor` (row-wise data in the tensor's
  shape; column-wise data transposed, [last, rest...] in the GEMM-ready format), `get_scale_shape`
  (scale-inverses in float32: 2-D 128x128 tiles [ceil(M/128), roundup(ceil(K/128), 4)], column-wise
  [ceil(K/128), roundup(ceil(M/128), 4)]; 1-D 1x128 blocks along K, stored transposed
  [ceil(K/128), roundup(M, 4)], column-wise [ceil(M/128), roundup(K, 4)]), and
  `convert_and_update_tensor` (allocates or drops each direction by the quantizer's usages);
- common/transpose/quantize_transpose_square_blockwise.cu (2-D) and
  quantize_transpose_vector_blockwise.cu (1-D): per tile or block, amax -> scale with
  compute_scale_from_types<IType, OType> (recipe_common.cuh; an infinite scale becomes the input
  type's largest value), scale_inv = 1 / scale, FP8 = cast(x * scale); the column-wise output is
  the transposed data, scaled per 128x128 tile (2-D: the same tiles) or per 128 entries along M
  (1-D). Padding entries of the scale-inverse tensors are left unwritten, as the kernels do.
- cublaslt_gemm.cu: block-scaled GEMMs are TN on Hopper: A's row-wise data when transposed,
  else its column-wise data; B's row-wise data when not transposed, else column-wise; a missing
  direction raises. The COMPACT format (2.8+ all-gather usage) is not twinned: it raises.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, storage

BLOCK = 128


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _roundup(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _dims(shape: list[int]) -> tuple[int, int]:
    k = shape[-1] if shape else 1
    m = 1
    for s in shape[:-1]:
        m *= s
    return m, k


def scale_shape(quantizer: Any, shape: list[int], columnwise: bool) -> list[int]:
    """Float8BlockQuantizer::get_scale_shape (GEMM-ready)."""
    m, k = _dims(shape)
    if quantizer.block_scaling_dim == 2:
        return (
            [_ceil(k, BLOCK), _roundup(_ceil(m, BLOCK), 4)]
            if columnwise
            else [_ceil(m, BLOCK), _roundup(_ceil(k, BLOCK), 4)]
        )
    if quantizer.block_scaling_dim == 1:
        return [_ceil(m, BLOCK), _roundup(k, 4)] if columnwise else [_ceil(k, BLOCK), _roundup(m, 4)]
    raise RuntimeError(f"Unsupported block_scaling_dim {quantizer.block_scaling_dim}. Expected 1 or 2.")


def _data_shape(shape: list[int]) -> storage.DirectionShape:
    """Row-wise data in the tensor's shape; column-wise data transposed (GEMM-ready)."""
    return lambda columnwise: storage.transpose_shape(shape) if columnwise else shape


def _scale_shape(quantizer: Any, shape: list[int]) -> storage.DirectionShape:
    return lambda columnwise: scale_shape(quantizer, shape, columnwise)


def _gemm_ready_format() -> Any:
    import sys

    formats = getattr(sys.modules["transformer_engine_torch"], "Float8BlockScaleTensorFormat", None)
    return None if formats is None else formats.GEMM_READY


def _check_format(quantizer: Any) -> None:
    if getattr(quantizer, "all_gather_usage", False):
        raise NotImplementedError("the CPU twin has no COMPACT-format FP8 block tensors (all_gather_usage)")


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype, device: Any = None) -> Any:
    """Float8BlockQuantizer::create_tensor."""
    _check_format(quantizer)
    fields = storage.new_direction_buffers(quantizer, _data_shape(shape), _scale_shape(quantizer, shape), torch.float32)
    fields.update(
        fp8_dtype=storage.python_dtype(dtypes.value(quantizer.dtype)),
        quantizer=quantizer,
        is_2D_scaled=quantizer.block_scaling_dim == 2,
        data_format=_gemm_ready_format(),
    )
    return storage.new_quantized("Float8BlockwiseQTensor", quantizer, shape, fake_dtype, fields)


def logical_shape(tensor: Any) -> list[int]:
    if tensor._rowwise_data is not None:
        return list(tensor._rowwise_data.shape)
    col = list(tensor._columnwise_data.shape)
    return [*col[1:], col[0]]


def coerce(quantizer: Any, tensor: Any) -> None:
    """Float8BlockQuantizer::convert_and_update_tensor."""
    _check_format(quantizer)
    if tensor._rowwise_data is None and tensor._columnwise_data is None:
        raise RuntimeError("FP8BlockwiseTensor has no data.")
    shape = logical_shape(tensor)
    storage.update_direction_buffers(
        tensor, quantizer, _data_shape(shape), _scale_shape(quantizer, shape), torch.float32
    )


def _value_for_inf(dtype: torch.dtype) -> float:
    """TypeInfo<IType>::max_finite_value: the largest value of the input type."""
    return float(torch.finfo(dtype).max) if dtype.is_floating_point else dtypes.FLOAT32_MAX


def _block_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """max|x| over blocks of `rows` x `cols` (edge blocks partial), NaN passed over (fmaxf)."""
    m, k = x.shape
    a = x.abs().float()
    a = torch.where(torch.isnan(a), torch.zeros((), dtype=torch.float32), a)
    padded = torch.zeros(_roundup(m, rows), _roundup(k, cols), dtype=torch.float32)
    padded[:m, :k] = a
    return padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).amax(dim=(1, 3))


def _expand(per_block: torch.Tensor, rows: int, cols: int, m: int, k: int) -> torch.Tensor:
    return per_block.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:m, :k]


def quantize(x: torch.Tensor, quantizer: Any, out: Any, noop: torch.Tensor | None) -> None:
    """nvte_quantize for block scaling into `out` (both directions the output holds)."""
    if storage.nothing_to_quantize(x, noop):
        return
    fp8 = dtypes.value(quantizer.dtype)
    matrix = storage.to_2d(x)
    m, k = matrix.shape
    fp8_max, inf = dtypes.FP8_MAX[fp8], _value_for_inf(x.dtype)
    pow2, eps = bool(quantizer.force_pow_2_scales), float(quantizer.amax_epsilon)
    if quantizer.block_scaling_dim == 2:
        scales = dtypes.scales_from_amax(_block_amax(matrix, BLOCK, BLOCK), fp8_max, pow2, eps, inf)
        row_scales = col_scales = _expand(scales, BLOCK, BLOCK, m, k)
        row_inv = torch.reciprocal(scales)  # [ceil(M/128), ceil(K/128)]
        col_inv = row_inv.t()
    else:
        row_blocks = dtypes.scales_from_amax(_block_amax(matrix, 1, BLOCK), fp8_max, pow2, eps, inf)  # [M, Kb]
        col_blocks = dtypes.scales_from_amax(_block_amax(matrix, BLOCK, 1), fp8_max, pow2, eps, inf)  # [Mb, K]
        row_scales = _expand(row_blocks, 1, BLOCK, m, k)
        col_scales = _expand(col_blocks, BLOCK, 1, m, k)
        row_inv = torch.reciprocal(row_blocks).t()  # stored transposed: [Kb, M]
        col_inv = torch.reciprocal(col_blocks)  # [Mb, K]
    if out._rowwise_data is not None:
        out._rowwise_data.copy_(dtypes.cast_fp8(matrix, row_scales, fp8).reshape(out._rowwise_data.shape))
        out._rowwise_scale_inv[: row_inv.shape[0], : row_inv.shape[1]].copy_(row_inv)
    if out._columnwise_data is not None:
        encoded = dtypes.cast_fp8(matrix, col_scales, fp8)
        out._columnwise_data.copy_(encoded.t().reshape(out._columnwise_data.shape))
        out._columnwise_scale_inv[: col_inv.shape[0], : col_inv.shape[1]].copy_(col_inv)


def _descale(values: torch.Tensor, scale_inv: torch.Tensor, is_2d: bool) -> torch.Tensor:
    """One direction's decoded values [R, C] times their scale-inverses. Both directions lay their
    scales out alike over their own [R, C] (the column-wise data is the row-wise layout of the
    transpose): per 128x128 tile, or per 1x128 block along C, stored transposed."""
    rows, cols = values.shape
    inv = scale_inv.float()
    if is_2d:
        per = _expand(inv[: _ceil(rows, BLOCK), : _ceil(cols, BLOCK)], BLOCK, BLOCK, rows, cols)
    else:
        per = _expand(inv[: _ceil(cols, BLOCK), :rows].t(), 1, BLOCK, rows, cols)
    return values * per


def _decode_rowwise(tensor: Any) -> torch.Tensor:
    """The float32 values of the row-wise data, [M, K]."""
    data = storage.to_2d(dtypes.decode_fp8(tensor._rowwise_data, storage.fp8_dtype_of(tensor)))
    return _descale(data, tensor._rowwise_scale_inv, tensor._is_2D_scaled)


def _decode_columnwise(tensor: Any) -> torch.Tensor:
    """The float32 values of the column-wise (transposed) data, [K, M]."""
    col = dtypes.decode_fp8(tensor._columnwise_data, storage.fp8_dtype_of(tensor))
    return _descale(col.reshape(col.shape[0], -1), tensor._columnwise_scale_inv, tensor._is_2D_scaled)


def gemm_operand(t: Any, transposed: bool, name: str) -> torch.Tensor:
    """op(t) for a block-scaled GEMM operand (see the module docstring)."""
    use_rowwise = transposed if name == "A" else not transposed
    if use_rowwise:
        if t._rowwise_data is None:
            raise RuntimeError(f"Input {name} is missing row-wise usage")
        m = _decode_rowwise(t)  # [rows, k]
        return m.t() if name == "A" else m
    if t._columnwise_data is None:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    m = _decode_columnwise(t)  # the transpose of the logical matrix
    return m.t() if name == "A" else m


def dequantize(tensor: Any, otype: torch.dtype) -> torch.Tensor:
    if tensor._rowwise_data is not None:
        values = _decode_rowwise(tensor)
        return values.reshape(tensor._rowwise_data.shape).to(otype)
    values = _decode_columnwise(tensor).t()
    return values.reshape(logical_shape(tensor)).to(otype)
