"""Each kernel of the CPU twin (harness/te_twin) against a direct computation, through TE's own
Python objects (its quantizers and tensor classes), in a twin process per release
(tests/twin/conftest.py). The expected values are computed here from the definitions in TE's C++
(cited in each kernel's module), not by calling the twin."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harness.te_twin.cells import release_key

pytestmark = pytest.mark.twin

E4M3_MAX = 448.0


def _tex() -> Any:
    return sys.modules["transformer_engine_torch"]


def _float8_quantizer(scale: float, amax: float = 0.0, *, rowwise: bool = True, columnwise: bool = True) -> Any:
    import torch

    from harness.te_twin import storage

    cls = _find("Float8Quantizer")
    return cls(
        torch.tensor([scale]), torch.tensor([amax]), storage.python_dtype(7), rowwise=rowwise, columnwise=columnwise
    )


def _find(name: str) -> Any:
    import importlib

    for where in ("transformer_engine.pytorch.tensor.float8_tensor", "transformer_engine.pytorch.float8_tensor"):
        module = importlib.import_module(where)
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


def _e4m3(values: Any, scale: float) -> Any:
    """The FP8 E4M3 bytes of values * scale, saturated: the definition (CUDA's satfinite cast)."""
    import torch

    return (values.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _x(rows: int = 32, cols: int = 64, seed: int = 0) -> Any:
    import torch

    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3


def test_quantize_delayed_scaling_casts_transposes_records_amax_and_round_trips(release: str) -> None:
    import torch

    x = _x()
    q = _float8_quantizer(scale=4.0, amax=1.5)
    out = _tex().quantize(x, q)
    assert type(out).__name__.startswith("Float8Tensor")
    assert torch.equal(out._data, _e4m3(x, 4.0))
    assert torch.equal(out._transpose, _e4m3(x, 4.0).t().contiguous())
    assert float(out._scale_inv) == 0.25
    assert float(q.amax) == float(x.abs().max())  # max(previous amax, max|x|)
    expected = _e4m3(x, 4.0).view(torch.float8_e4m3fn).float() / 4.0
    assert torch.equal(out.dequantize().float(), expected)
    assert float((out.dequantize().float() - x).abs().max()) <= float(x.abs().max()) / 16


def test_quantize_keeps_a_larger_recorded_amax_and_saturates_out_of_range_values(release: str) -> None:
    import torch

    x = torch.tensor([[1000.0, -1000.0, float("nan"), 1.0] * 4] * 16)
    q = _float8_quantizer(scale=1.0, amax=5000.0)
    out = _tex().quantize(x, q)
    decoded = out._data.view(torch.float8_e4m3fn).float()
    assert decoded[0, 0] == E4M3_MAX and decoded[0, 1] == -E4M3_MAX and torch.isnan(decoded[0, 2])
    assert float(q.amax) == 5000.0


def test_quantize_with_the_noop_flag_set_changes_nothing(release: str) -> None:
    import torch

    x = _x()
    q = _float8_quantizer(scale=2.0)
    out = _tex().quantize(x, q)
    before = (out._data.clone(), out._transpose.clone(), out._scale_inv.clone(), q.amax.clone())
    q2 = _float8_quantizer(scale=8.0)
    q2.amax = q.amax
    _tex().quantize(x * 2, q2, out, torch.tensor([1.0]))
    after = (out._data, out._transpose, out._scale_inv, q.amax)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_quantize_into_an_existing_tensor_follows_the_quantizer_usages(release: str) -> None:
    """convert_and_update_tensor: a row-wise-only quantizer drops the transpose and marks it
    invalid; a column-wise one (on Hopper) gives it back and fills it."""
    import torch

    x = _x()
    out = _tex().quantize(x, _float8_quantizer(scale=1.0))
    _tex().quantize(x, _float8_quantizer(scale=2.0, columnwise=False), out)
    assert out._transpose is None and out._transpose_invalid
    assert torch.equal(out._data, _e4m3(x, 2.0))
    again: Any = _tex().quantize(x, _float8_quantizer(scale=2.0), out)
    assert not again._transpose_invalid and torch.equal(again._transpose, _e4m3(x, 2.0).t().contiguous())


@pytest.mark.parametrize(
    ("amax", "epsilon", "pow2", "expected"),
    [
        (2.0, 0.0, False, 224.0),
        (0.0, 0.0, False, 1.0),  # zero amax: scale 1
        (1e-40, 0.0, False, 3.4028234663852886e38),  # the scale overflows float32: float32 max
        (3.0, 0.0, True, 128.0),  # 448 / 3 = 149.3, mantissa cleared
        (1e-3, 0.5, False, 896.0),  # amax floored at epsilon
    ],
)
def test_current_scaling_scale_from_amax(
    release: str, amax: float, epsilon: float, pow2: bool, expected: float
) -> None:
    """compute_scale_from_amax (common/recipe/recipe_common.cuh), through a current-scaling quantize."""
    import torch

    cls = _find("Float8CurrentScalingQuantizer") if release_key(release) >= (2, 2) else None
    if cls is None:
        pytest.skip(f"TE {release} has no current scaling")
    from harness.te_twin import storage

    q = cls(storage.python_dtype(7), torch.device("cpu"), force_pow_2_scales=pow2, amax_epsilon=epsilon)
    x = torch.zeros(16, 16)
    x[0, 0] = amax
    out = _tex().quantize(x, q)
    scale = torch.tensor(expected, dtype=torch.float32)
    assert torch.equal(out._scale_inv.reshape(()), torch.reciprocal(scale))
    assert torch.equal(out._data, _e4m3(x, float(scale)))


def _histories() -> tuple[Any, Any]:
    import torch

    history = torch.tensor([[0.0, 3.0, 0.0], [1.0, 1.0, 7.0], [2.0, 9.0, 0.5]])  # row 0: this step's amax
    scale = torch.tensor([1.0, 2.0, 4.0])
    return history, scale


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_amax_history_roll_and_scale_update(release: str, algo: str) -> None:
    """delayed_scaling.cu kernel_bulk: for each scale, the newest amax (the reduction buffer's,
    else row 0) rolls into the history's last row when it is not 0; the scale is
    (448 * 2^-margin) / amax; an index whose newest amax is 0 neither rolls nor changes scale."""
    import torch

    history, scale = _histories()
    buffer = torch.tensor([0.0, 6.0, 0.0])  # index 1 reduced to 6 (e.g. across ranks)
    _tex().fused_amax_and_scale_update_after_reduction(buffer, [history], [scale], algo, _tex().DType.kFloat8E4M3, 1.0)
    # index 0: newest 0 -> history untouched, scale kept
    assert history[:, 0].tolist() == [0.0, 1.0, 2.0] and float(scale[0]) == 1.0
    # index 1: newest 6 (buffer) -> rows [0, 9, 6]; index 2: newest 0 -> untouched
    assert history[:, 1].tolist() == [0.0, 9.0, 6.0] and history[:, 2].tolist() == [0.0, 7.0, 0.5]
    amax = 9.0 if algo == "max" else 6.0
    assert float(scale[1]) == float(torch.tensor(224.0) / amax)
    assert float(scale[2]) == 4.0


def _gemm(*args: Any, **kwargs: Any) -> Any:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    out = general_gemm(*args, **kwargs)
    return out[0] if isinstance(out, (list, tuple)) else out


def _workspace_args(release: str) -> tuple[Any, ...]:
    """general_gemm's positional workspace argument before 2.9 (2.9+ gets its own)."""
    import inspect

    from transformer_engine.pytorch.cpp_extensions import general_gemm

    if "workspace" in inspect.signature(general_gemm).parameters:
        import torch

        return (torch.empty(1024, dtype=torch.uint8),)
    return ()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_gemm_layouts_in_high_precision(release: str, layout: str) -> None:
    """D = op(B) @ op(A) with op = transpose for a "T" flag: TN is x @ W.T, NN dy @ W, NT dy.T @ x."""
    import torch

    a = _x(32, 64, 1)
    b = {"TN": _x(16, 64, 2), "NN": _x(16, 32, 2), "NT": _x(16, 32, 2)}[layout]
    if layout == "NT":
        a = _x(16, 64, 1)
    d = _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)
    op_a = a.t() if layout[0] == "T" else a
    op_b = b.t() if layout[1] == "T" else b
    assert torch.allclose(d, op_b @ op_a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_fp8_gemm_reads_the_buffers_cublas_reads_on_hopper(release: str, layout: str) -> None:
    """Per-tensor FP8 on sm90 runs TN only: A's row-wise data when transposed, else its transpose;
    B's row-wise data when not transposed, else its transpose. The buffer the GPU does not read is
    overwritten with garbage here: the result must not change."""
    import torch

    a_values = _x(32, 64, 1) if layout != "NT" else _x(16, 64, 1)
    b_values = {"TN": _x(16, 64, 2), "NN": _x(16, 32, 2), "NT": _x(16, 32, 2)}[layout]
    a = _tex().quantize(a_values, _float8_quantizer(scale=8.0))
    b = _tex().quantize(b_values, _float8_quantizer(scale=16.0))
    reference = _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)
    deq_a, deq_b = a.dequantize().float(), b.dequantize().float()
    op_a = deq_a.t() if layout[0] == "T" else deq_a
    op_b = deq_b.t() if layout[1] == "T" else deq_b
    assert torch.allclose(reference, op_b @ op_a, rtol=1e-5, atol=1e-4)
    (a._transpose if layout[0] == "T" else a._data).fill_(0x7E)  # the buffers the GPU does not read
    (b._data if layout[1] == "T" else b._transpose).fill_(0x7E)
    assert torch.equal(_gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout), reference)


@pytest.mark.parametrize("how", ["dropped", "invalid"])
def test_fp8_dgrad_gemm_raises_like_te_when_the_weight_transpose_is_missing(release: str, how: str) -> None:
    """cublaslt_gemm.cu CanonicalizeGemmInput: an FP8 A in an "N" layout on Hopper needs its
    column-wise copy; None or `_transpose_invalid` raises "Input A is missing column-wise usage"
    (so a transpose dropped and never rebuilt cannot pass unnoticed)."""
    weight = _tex().quantize(_x(32, 64, 1), _float8_quantizer(scale=8.0))
    dy = _tex().quantize(_x(16, 32, 2), _float8_quantizer(scale=8.0))
    if how == "dropped":
        weight._transpose = None
    weight._transpose_invalid = True
    with pytest.raises(RuntimeError, match="Input A is missing column-wise usage"):
        _gemm(weight, dy, *_workspace_args(release), layout="NN")


def test_gemm_epilogues_bias_gelu_and_bias_gradient(release: str) -> None:
    import torch

    from harness.te_twin import activations

    w, x, bias = _x(32, 64, 1), _x(16, 64, 2), _x(1, 32, 3).reshape(-1)
    out = _gemm(w, x, *_workspace_args(release), out_dtype=torch.float32, bias=bias, layout="TN")
    assert torch.allclose(out, x @ w.t() + bias, rtol=1e-5, atol=1e-4)
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    d, *rest = general_gemm(w, x, *_workspace_args(release), out_dtype=torch.float32, bias=bias, gelu=True, layout="TN")
    pre = next(r for r in rest if isinstance(r, torch.Tensor) and r.shape == d.shape)
    assert torch.allclose(pre, x @ w.t() + bias, rtol=1e-5, atol=1e-4)
    assert torch.equal(d, activations.gelu_f32(pre))
    dy = _x(16, 32, 4)
    _, grad_bias, *_ = general_gemm(
        x, dy, *_workspace_args(release), out_dtype=torch.float32, bias=bias, grad=True, layout="NT"
    )
    assert torch.allclose(grad_bias, dy.sum(0), rtol=1e-5, atol=1e-4)


def test_layernorm_forward_and_backward_match_torch(release: str) -> None:
    import torch

    x = _x(16, 64, 1).requires_grad_()
    gamma = (_x(1, 64, 2).reshape(-1) / 3).requires_grad_()
    beta = (_x(1, 64, 3).reshape(-1) / 3).requires_grad_()
    ref = torch.nn.functional.layer_norm(x, (64,), gamma, beta, eps=1e-5)
    dz = _x(16, 64, 4)
    ref.backward(dz)
    out, mu, rsigma = _tex().layernorm_fwd(
        x.detach(), gamma.detach(), beta.detach(), 1e-5, None, None, _tex().DType.kFloat32, 0, False
    )
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    dx, dgamma, dbeta = _tex().layernorm_bwd(dz, x.detach(), mu, rsigma, gamma.detach(), 0, False)
    for mine, theirs in ((dx, x.grad), (dgamma, gamma.grad), (dbeta, beta.grad)):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-4)


def test_rmsnorm_forward_and_backward_match_a_direct_computation(release: str) -> None:
    import torch

    x = _x(16, 64, 1).requires_grad_()
    gamma = (_x(1, 64, 2).reshape(-1) / 3).requires_grad_()
    ref = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * gamma
    dz = _x(16, 64, 4)
    ref.backward(dz)
    out, _, rsigma = _tex().rmsnorm_fwd(x.detach(), gamma.detach(), 1e-5, None, None, _tex().DType.kFloat32, 0, False)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    dx, dgamma = _tex().rmsnorm_bwd(dz, x.detach(), rsigma, gamma.detach(), 0, False)
    assert torch.allclose(dx, x.grad, rtol=1e-4, atol=1e-4) and torch.allclose(dgamma, gamma.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gelu", "relu", "silu", "qgelu", "srelu", "geglu", "swiglu", "reglu"])
def test_activation_and_its_gradient_match_autograd(release: str, name: str) -> None:
    import torch

    forms = {
        "gelu": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
        "relu": torch.relu,
        "silu": torch.nn.functional.silu,
        "qgelu": lambda v: v * torch.sigmoid(1.702 * v),
        "srelu": lambda v: torch.relu(v) ** 2,
    }
    gated = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}
    x = _x(16, 64, 1).requires_grad_()
    if name in gated:
        a, lin = x.chunk(2, dim=-1)
        ref = forms[gated[name]](a) * lin
    else:
        ref = forms[name](x)
    dy = _x(ref.shape[0], ref.shape[1], 2)
    ref.backward(dy)
    out = getattr(_tex(), name)(x.detach(), None)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    grad = getattr(_tex(), "d" + name)(dy, x.detach(), None)
    assert torch.allclose(grad, x.grad, rtol=1e-4, atol=1e-4)


def test_dbias_dgelu_and_bgrad_quantize_return_the_row_sum_and_the_quantized_gradient(release: str) -> None:
    import torch

    x, dy = _x(16, 64, 1), _x(16, 64, 2)
    grad = _tex().dgelu(dy, x, None)
    dbias, quantized = _tex().dbias_dgelu(dy, x, _float8_quantizer(scale=4.0))
    assert torch.allclose(dbias, grad.sum(0), rtol=1e-5, atol=1e-4)
    assert torch.equal(quantized._data, _e4m3(grad, 4.0))
    dbias2, quantized2 = _tex().bgrad_quantize(dy, _float8_quantizer(scale=4.0))
    assert torch.allclose(dbias2, dy.sum(0), rtol=1e-5, atol=1e-4) and torch.equal(quantized2._data, _e4m3(dy, 4.0))


def test_fp8_transpose_is_the_byte_transpose(release: str) -> None:
    import torch

    data = torch.randint(0, 255, (32, 64), dtype=torch.uint8)
    assert torch.equal(_tex().fp8_transpose(data, _tex().DType.kFloat8E4M3), data.t())


def test_split_quantize_and_grouped_gemm_match_their_parts(release: str) -> None:
    import torch
    from transformer_engine.pytorch.cpp_extensions import general_grouped_gemm

    x = _x(32, 64, 1)
    quantizers = [_float8_quantizer(scale=4.0), _float8_quantizer(scale=8.0)]
    if hasattr(_tex(), "split_quantize") and release_key(release) >= (2, 5):
        parts = _tex().split_quantize(x, [12, 20], quantizers)
    else:
        parts = _tex().fused_multi_quantize(list(torch.split(x, [12, 20])), None, quantizers, _tex().DType.kFloat32)
    assert torch.equal(parts[0]._data, _e4m3(x[:12], 4.0)) and torch.equal(parts[1]._data, _e4m3(x[12:], 8.0))
    weights = [_x(32, 64, 2), _x(32, 64, 3)]
    inputs = [x[:12], x[12:]]
    out = torch.empty(32, 32)
    import inspect

    params = inspect.signature(general_grouped_gemm).parameters
    kwargs: dict[str, Any] = {"out_dtype": torch.float32, "layout": "TN", "m_splits": [12, 20], "single_output": True}
    if "workspaces" in params:  # before 2.10: the caller's cuBLAS workspaces
        kwargs["workspaces"] = [torch.empty(1024, dtype=torch.uint8)] * 4
    if "quantization_params" in params:
        kwargs["quantization_params"] = [None, None]
    general_grouped_gemm(weights, inputs, [out], **kwargs)
    expected = torch.cat([inputs[0] @ weights[0].t(), inputs[1] @ weights[1].t()])
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_a_kernel_the_twin_lacks_raises_naming_it(release: str) -> None:
    from harness.te_twin import MissingKernel

    tex = _tex()
    with pytest.raises(MissingKernel, match=r"transformer_engine_torch\.fused_attn_fwd is not implemented"):
        tex.fused_attn_fwd  # noqa: B018 - reading it is what raises
    assert not hasattr(tex, "fused_rope_forward")  # TE's feature probes see it as absent
    assert "fused_attn_fwd" in tex.missing


def _block_quantizer(dim: int) -> Any:
    import importlib

    from harness.te_twin import storage

    module = importlib.import_module("transformer_engine.pytorch.tensor.float8_blockwise_tensor")
    return module.Float8BlockQuantizer(storage.python_dtype(7), rowwise=True, columnwise=True, block_scaling_dim=dim)


@pytest.mark.parametrize("dim", [1, 2])
def test_block_quantize_scales_each_block_by_its_amax(release: str, dim: int) -> None:
    """quantize_transpose_{vector,square}_blockwise.cu: 1x128 blocks (dim 1) or 128x128 tiles
    (dim 2), power-of-two scales (the recipe's default) from each block's amax, scale-inverses in
    the GEMM-ready layout, the column-wise copy transposed."""
    import torch

    if release_key(release) < (2, 3):
        pytest.skip(f"TE {release} has no FP8 block scaling")
    x = _x(256, 384, 5)
    x[3, 7] = 200.0  # one large value: its block gets a smaller scale than the others
    out = _tex().quantize(x, _block_quantizer(dim))

    def pow2_scale(amax: Any) -> Any:
        scale = torch.tensor(E4M3_MAX) / amax
        return (scale.view(torch.int32) & -8388608).view(torch.float32)

    rows = 1 if dim == 1 else 128
    expected = torch.empty_like(x)
    for r0 in range(0, 256, rows):
        for c0 in range(0, 384, 128):
            block = x[r0 : r0 + rows, c0 : c0 + 128]
            scale = pow2_scale(block.abs().max())
            expected[r0 : r0 + rows, c0 : c0 + 128] = scale
            inv = out._rowwise_scale_inv[r0 // 128, c0 // 128] if dim == 2 else out._rowwise_scale_inv[c0 // 128, r0]
            assert float(inv) == float(1 / scale)
    assert torch.equal(out._rowwise_data, _e4m3(x * expected, 1.0))
    assert out._columnwise_data.shape == (384, 256)
    if dim == 2:  # the same tiles, transposed
        assert torch.equal(out._columnwise_data, out._rowwise_data.t())
    assert torch.allclose(out.dequantize().float(), x, rtol=0.07, atol=float(x.abs().max()) / 64)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_block_scaled_gemm_matches_the_dequantized_product(release: str, layout: str) -> None:
    import torch

    if release_key(release) < (2, 3):
        pytest.skip(f"TE {release} has no FP8 block scaling")
    shapes = {"TN": ((256, 128), (128, 128)), "NN": ((128, 256), (128, 128)), "NT": ((128, 256), (128, 128))}
    (a_shape, b_shape) = shapes[layout]
    a = _tex().quantize(_x(*a_shape, seed=1), _block_quantizer(2))
    b = _tex().quantize(_x(*b_shape, seed=2), _block_quantizer(1))
    d = _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)
    deq_a, deq_b = a.dequantize().float(), b.dequantize().float()
    op_a = deq_a.t() if layout[0] == "T" else deq_a
    op_b = deq_b.t() if layout[1] == "T" else deq_b
    assert torch.allclose(d, op_b @ op_a, rtol=0.02, atol=1.0)  # 1-D blocks read column-wise differ by rounding


def _mxfp8_quantizer() -> Any:
    import importlib

    from harness.te_twin import storage

    module = importlib.import_module("transformer_engine.pytorch.tensor.mxfp8_tensor")
    return module.MXFP8Quantizer(storage.python_dtype(7), rowwise=True, columnwise=True)


@pytest.mark.twin(sm=100)
def test_mxfp8_quantize_uses_e8m0_scales_of_each_32_block(release: str) -> None:
    """common/cast/mxfp8 + util/ptx: per 1x32 (row-wise) or 32x1 (column-wise) block, the E8M0
    code of amax / 448 rounded up; the data is cast(x / 2^(code - 127))."""
    import math

    import torch

    x = _x(64, 128, 6)
    out = _tex().quantize(x, _mxfp8_quantizer())
    for r in range(0, 64, 7):
        for kb in range(4):
            block = x[r, kb * 32 : (kb + 1) * 32]
            code = math.ceil(math.log2(float(block.abs().max()) / E4M3_MAX)) + 127
            assert int(out._rowwise_scale_inv[r, kb]) == code
            expected = _e4m3(block, 2.0 ** (127 - code))
            assert torch.equal(out._rowwise_data[r, kb * 32 : (kb + 1) * 32], expected)
    column = x[0:32, 5]
    code = math.ceil(math.log2(float(column.abs().max()) / E4M3_MAX)) + 127
    assert int(out._columnwise_scale_inv[0, 5]) == code
    assert out._columnwise_data.shape == x.shape  # MXFP8 column-wise data is not transposed
    assert torch.allclose(out.dequantize().float(), x, rtol=0.07, atol=float(x.abs().max()) / 64)


@pytest.mark.twin(sm=100)
def test_mxfp8_swizzled_scales_are_a_permutation_that_round_trips(release: str) -> None:
    import torch

    from harness.te_twin import mxfp8

    scales = torch.randint(0, 255, (256, 8), dtype=torch.uint8)
    swizzled = mxfp8.swizzle(scales)
    assert not torch.equal(swizzled, scales) and torch.equal(mxfp8.unswizzle(swizzled), scales)
    assert sorted(swizzled.reshape(-1).tolist()) == sorted(scales.reshape(-1).tolist())
    # cuBLAS's layout: row r, column c of a 128x4 tile at byte (r % 32) * 16 + (r // 32) * 4 + c
    assert int(swizzled.reshape(-1)[(37 % 32) * 16 + (37 // 32) * 4 + 2]) == int(scales[37, 2])


@pytest.mark.twin(sm=100)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_mxfp8_gemm_reads_rowwise_or_columnwise_data_by_layout(release: str, layout: str) -> None:
    """The MXFP8 GEMM multiplies A's row-wise data when transposed, else its column-wise data (and
    B the other way round): overwriting the other direction changes nothing; dropping the needed
    one raises."""
    import torch

    shapes = {"TN": ((128, 64), (32, 64)), "NN": ((64, 128), (32, 64)), "NT": ((32, 128), (32, 64))}
    (a_shape, b_shape) = shapes[layout]
    a = _tex().quantize(_x(*a_shape, seed=1), _mxfp8_quantizer())
    b = _tex().quantize(_x(*b_shape, seed=2), _mxfp8_quantizer())
    d = _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)
    deq_a, deq_b = a.dequantize().float(), b.dequantize().float()
    op_a = deq_a.t() if layout[0] == "T" else deq_a
    op_b = deq_b.t() if layout[1] == "T" else deq_b
    assert torch.allclose(d, op_b @ op_a, rtol=0.05, atol=1.0)
    (a._columnwise_data if layout[0] == "T" else a._rowwise_data).fill_(0x7E)
    (b._rowwise_data if layout[1] == "T" else b._columnwise_data).fill_(0x7E)
    assert torch.equal(_gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout), d)
    if layout[0] == "N":
        a._columnwise_data = None
        with pytest.raises(RuntimeError, match="Input A is missing column-wise usage"):
            _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)


def test_the_device_answers_as_one_hopper_gpu_whose_memory_is_the_cpus(release: str) -> None:
    """device.py / redirect.py: sm90, CUDA 12.9, one device; "cuda" allocations (also an int
    device index) land on the CPU; pinning copies; a custom Function's backward runs inside the
    redirect too (autograd runs it outside the forward's mode stack)."""
    import torch

    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    assert torch.cuda.get_device_capability() == (9, 0) and torch.version.cuda == "12.9"
    assert torch.empty(4, device="cuda").device.type == "cpu"
    assert torch.zeros(2, device=torch.cuda.current_device()).device.type == "cpu"
    host = torch.ones(3)
    pinned = host.pin_memory()
    pinned.zero_()
    assert float(host.sum()) == 3.0

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad * torch.full_like(grad, 2.0, device="cuda")

    x = torch.ones(3, requires_grad=True)
    Twice.apply(x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.twin(sm=100)
def test_the_device_answers_as_blackwell_for_mxfp8(release: str) -> None:
    import torch

    assert torch.cuda.get_device_capability() == (10, 0)
    name = torch.cuda.get_device_properties(0).name
    assert "B200" in name and "twin" in name


# NVFP4 (harness/te_twin/nvfp4.py): the recipe parameter gives these tests an sm100 twin and keeps
# them off releases without the recipe (tests/twin/conftest.py)
NVFP4 = pytest.mark.parametrize("recipe", ["NVFP4BlockScaling"])
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_GLOBAL = 448.0 * 6.0  # S_enc = 448 * 6 / amax (core_nvfp4.cuh)


def _nvfp4_quantizer(**kwargs: Any) -> Any:
    import importlib

    module = importlib.import_module("transformer_engine.pytorch.tensor.nvfp4_tensor")
    return module.NVFP4Quantizer(**kwargs)


def _bf16(rows: int, cols: int, seed: int = 0) -> Any:
    import torch

    return _x(rows, cols, seed).to(torch.bfloat16)


def _e4m3_bytes(values: Any) -> Any:
    import torch

    return values.float().clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _unpack_nibbles(data: Any) -> Any:
    """[R, C/2] bytes -> [R, C] codes, byte i = element 2i (low nibble) | element 2i+1 (high)."""
    import torch

    return torch.stack([data & 0x0F, data >> 4], dim=-1).reshape(data.shape[0], -1)


@NVFP4
def test_nvfp4_e2m1_codes_round_trip_every_value_two_a_byte_low_nibble_first(release: str, recipe: str) -> None:
    """E2M1: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, code = index of the magnitude, + 8 for the sign; byte i
    holds element 2i in its low nibble. Each 16-block below holds all 16 values (amax 6), so the
    global scale is 448 * 6 / 6 and every block scale E4M3(448) = 0x7E: the bytes are the codes."""
    import torch

    values = torch.tensor([*E2M1, *(-v for v in E2M1)])
    codes = torch.arange(16)
    g = torch.Generator().manual_seed(0)
    order = torch.stack([torch.randperm(16, generator=g) for _ in range(32)]).reshape(16, 32)
    x, code = values[order], codes[order]
    out = _tex().quantize(x.to(torch.bfloat16), _nvfp4_quantizer(rowwise=True, columnwise=False))
    assert out._columnwise_data is None and out._rowwise_data.shape == (16, 16)
    assert torch.equal(out._rowwise_data, (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8))
    assert out._rowwise_scale_inv.shape == (128, 4)  # [roundup(M, 128), roundup(K / 16, 4)]
    assert torch.all(out._rowwise_scale_inv[:16, :2] == 0x7E) and float(out._amax_rowwise) == 6.0
    assert torch.allclose(out.dequantize().float(), x, rtol=1e-6, atol=0)
    assert torch.equal(torch.signbit(out.dequantize().float()), torch.signbit(x))


@NVFP4
@pytest.mark.parametrize("two_d", [False, True])
def test_nvfp4_block_scales_are_e4m3_of_block_amax_times_the_global_scale(
    release: str, recipe: str, two_d: bool
) -> None:
    """quantize_transpose_nvfp4.cuh: S_enc = 448 * 6 / amax; per 1x16 block (or 16x16 tile with
    `with_2d_quantization`, TE's weight quantization) the scale E4M3(block_amax * (S_enc / 6));
    the column-wise copy is the transpose, scaled along its own rows (the same tiles in 2-D, so
    its codes are the row-wise codes transposed); each value is within a sixth of its block's
    amax (E2M1's widest step, 4 to 6) plus the scale's rounding. A zero tensor has scale 1."""
    import torch

    x = _bf16(64, 128, 7)
    x[5, 9] = 40.0
    out = _tex().quantize(x, _nvfp4_quantizer(with_2d_quantization=two_d))
    xf = x.float()
    amax = xf.abs().max()
    s_enc = torch.tensor(FP4_GLOBAL) / amax
    rows = 16 if two_d else 1

    def block_amax(m: Any) -> Any:
        r, c = m.shape
        return m.abs().reshape(r // rows, rows, c // 16, 16).amax(dim=(1, 3)).repeat_interleave(rows, 0)

    sixth = torch.tensor(1.0 / 6.0)
    assert torch.equal(out._rowwise_scale_inv[:64, :8], _e4m3_bytes(block_amax(xf) * (s_enc * sixth)))
    assert torch.equal(out._columnwise_scale_inv[:128, :4], _e4m3_bytes(block_amax(xf.t()) * (s_enc * sixth)))
    assert out._rowwise_scale_inv.shape == (128, 8) and out._columnwise_scale_inv.shape == (128, 4)
    assert out._columnwise_data.shape == (128, 32)
    assert float(out._amax_rowwise) == float(out._amax_columnwise) == float(amax)
    if two_d:
        assert torch.equal(_unpack_nibbles(out._columnwise_data), _unpack_nibbles(out._rowwise_data).t())
    bound = block_amax(xf).repeat_interleave(16, 1) * (1.0 / 6.0) * 1.07
    assert bool(((out.dequantize().float() - xf).abs() <= bound).all())
    zero = _tex().quantize(torch.zeros(32, 32, dtype=torch.bfloat16), _nvfp4_quantizer())
    assert float(zero._amax_rowwise) == 0.0 and not zero._rowwise_data.any()
    assert not zero._rowwise_scale_inv.any() and torch.equal(zero.dequantize().float(), torch.zeros(32, 32))


def _sylvester(n: int) -> Any:
    import torch

    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@NVFP4
def test_nvfp4_rht_is_an_orthogonal_signed_hadamard_and_cancels_in_the_wgrad_gemm(release: str, recipe: str) -> None:
    """The quantizer's `rht_matrix` (TE's Python) is diag(signs) @ H16 / 4 with random signs, so
    orthogonal. With `with_rht` the column-wise copy is RHT(x.T) (its amax the transformed one's),
    the row-wise copy is x's own; in the wgrad GEMM (NT) both operands are transformed along the
    contraction dimension, so the transforms cancel: the product is dy.T @ x up to FP4's error, and
    a GEMM with only one operand transformed is far from it."""
    import torch

    q = _nvfp4_quantizer(with_rht=True, with_post_rht_amax=True)
    h = q.rht_matrix.float()
    signs = h[:, 0] * 4
    assert torch.equal(h, torch.diag(signs) @ _sylvester(16) / 4) and bool((signs == -1).any())
    assert torch.equal(h @ h.t(), torch.eye(16))
    x, dy = _bf16(64, 128, 1), _bf16(64, 32, 2)
    qx = _tex().quantize(x, q)
    transformed = (x.float().t().reshape(-1, 16) @ h).reshape(128, 64).to(torch.bfloat16)
    assert float(qx._amax_columnwise) == float(transformed.abs().max())
    assert float(qx._amax_rowwise) == float(x.abs().max())
    exact = dy.float().t() @ x.float()

    def error(b: Any) -> float:
        d = _gemm(qx, b, *_workspace_args(release), out_dtype=torch.float32, layout="NT")
        return float((d - exact).norm() / exact.norm())

    assert error(_tex().quantize(dy, _nvfp4_quantizer(with_rht=True, with_post_rht_amax=True))) < 0.2
    assert error(_tex().quantize(dy, _nvfp4_quantizer())) > 0.5


@NVFP4
def test_nvfp4_stochastic_rounding_is_seeded_by_cudas_generator_and_unbiased(release: str, recipe: str) -> None:
    """With `stochastic_rounding` (TE's gradients) a value between two E2M1 values rounds up with
    probability proportional to its distance from the lower one: 0.625 (a quarter of the way from
    0.5 to 1, at unit scale) averages 0.625, where rounding to nearest gives 0.5. The random bits
    come from CUDA's generator (the CPU's on the twin), which the quantize advances: the same seed
    gives the same bytes, the next call others."""
    import torch

    x = torch.full((256, 256), 0.625, dtype=torch.bfloat16)
    x[:, ::16] = 6.0  # unit scale in every block
    q = _nvfp4_quantizer(columnwise=False, stochastic_rounding=True)
    torch.manual_seed(11)
    seeded = torch.cuda.get_rng_state()
    first = _tex().quantize(x, q)
    assert not torch.equal(torch.cuda.get_rng_state(), seeded), "the quantize drew from CUDA's generator"
    following = _tex().quantize(x, q)
    torch.manual_seed(11)
    again = _tex().quantize(x, q)
    assert torch.equal(first._rowwise_data, again._rowwise_data)
    assert not torch.equal(first._rowwise_data, following._rowwise_data)
    inner = torch.ones(256, 256, dtype=torch.bool)
    inner[:, ::16] = False
    values = first.dequantize().float()[inner]
    assert set(values.unique().tolist()) == {0.5, 1.0}
    assert abs(float(values.mean()) - 0.625) < 0.01
    nearest = _tex().quantize(x, _nvfp4_quantizer(columnwise=False)).dequantize().float()[inner]
    assert set(nearest.unique().tolist()) == {0.5}


@NVFP4
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_nvfp4_gemm_reads_the_direction_and_the_amax_cublas_reads(release: str, recipe: str, layout: str) -> None:
    """cublaslt_gemm.cu (NVFP4, TN only): A's row-wise data and amax when transposed, else its
    column-wise ones; B the other way round; cuBLAS's alpha is amax_A * amax_B / (6 * 448)^2.
    Overwriting the other direction (data and amax) changes nothing, doubling the amax it reads
    doubles the result, dropping the direction it needs raises."""
    import torch

    shapes = {"TN": ((128, 64), (32, 64)), "NN": ((64, 128), (32, 64)), "NT": ((32, 128), (32, 64))}
    (a_shape, b_shape) = shapes[layout]
    a_values, b_values = _bf16(*a_shape, seed=1), _bf16(*b_shape, seed=2)
    a = _tex().quantize(a_values, _nvfp4_quantizer())
    b = _tex().quantize(b_values, _nvfp4_quantizer())

    def gemm() -> Any:
        return _gemm(a, b, *_workspace_args(release), out_dtype=torch.float32, layout=layout)

    d = gemm()
    op_a = a_values.float().t() if layout[0] == "T" else a_values.float()
    op_b = b_values.float().t() if layout[1] == "T" else b_values.float()
    exact = op_b @ op_a
    assert float((d - exact).norm() / exact.norm()) < 0.2
    a_row, b_row = layout[0] == "T", layout[1] == "N"
    (a._columnwise_data if a_row else a._rowwise_data).fill_(0x77)
    (a._amax_columnwise if a_row else a._amax_rowwise).mul_(4)
    (b._columnwise_data if b_row else b._rowwise_data).fill_(0x77)
    (b._amax_columnwise if b_row else b._amax_rowwise).mul_(4)
    assert torch.equal(gemm(), d)
    (a._amax_rowwise if a_row else a._amax_columnwise).mul_(2)
    assert torch.equal(gemm(), d * 2)
    if not a_row:
        a._columnwise_data = None
        with pytest.raises(RuntimeError, match="Input A is missing column-wise usage"):
            gemm()


@NVFP4
def test_nvfp4_refuses_float32_activations_with_tes_own_error(release: str, recipe: str) -> None:
    """Why the NVFP4 cells train in bf16 (harness/te_twin/cells.py BF16_ONLY): TE's recipe applies
    the Hadamard transform to the layer's input, which its C++ refuses for float32."""
    import torch

    from harness import te_twin
    from harness.te_twin import training

    layer = training.build("Linear")
    assert layer.weight.dtype == torch.float32
    with pytest.raises(RuntimeError, match="RHT is only supported for bfloat16 input"):
        with te_twin.autocast(training.make_recipe(recipe)):
            layer(training.batch(0, 0), is_first_microbatch=True)
