"""The extension's GEMMs: `generic_gemm` and `te_general_grouped_gemm`, reading the operand
buffers cuBLAS reads.

Layout (csrc/extensions/gemm.cpp `gemm`, common/gemm/cublaslt_gemm.cu `CanonicalizeGemmInput`;
TransformerEngine main = 2.20.0.dev0 and v2.9): TE passes row-major A and B with cuBLAS's
column-major transpose flags, so with both flattened to 2-D the output is

    D = op(B) @ op(A),   op(A) = A.T if transa else A,   op(B) = B.T if transb else B

(forward "TN": x @ W.T; dgrad "NN": dy @ W; wgrad "NT": dy.T @ x), shaped by getGemmOutputShape
(B's leading dimensions unflattened unless transb). FP8 operands are read from the buffer the GPU
would use, and a missing one raises the GPU's error:
- per-tensor FP8 on Hopper (sm90) runs only TN GEMMs: A is read from its row-wise `_data` when
  transa, else from its column-wise copy (`_transpose`, the transpose of the data); B from `_data`
  unless transb, else from `_transpose`. A column-wise copy that is None or `_transpose_invalid`
  is "missing column-wise usage" (the C++ wrapper leaves invalid transposes out). On Blackwell
  (sm100) any layout runs from `_data`;
- MXFP8 and FP8 block scaling: the row-wise data when A is transposed / B is not, else the
  column-wise data (harness/te_twin/mxfp8.py, blockwise.py give the values);
- NVFP4 (TN only, both operands NVFP4): the same choice of direction, each with its own amax;
  the block-scaled values are multiplied and the result scaled by amax_A * amax_B / (6 * 448)^2,
  as cuBLAS applies TE's per-tensor alpha (harness/te_twin/nvfp4.py).
Values are decoded, scaled by their scale-inverses and multiplied in float32 (cuBLAS accumulates
FP8 and 16-bit GEMMs in float32); epilogues: bias, GELU with its input saved (forward), dGELU and
the bias gradient (backward: of B for BGRADB, of the output for DGELU_BGRAD).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import activations, dtypes, nvfp4, storage
from harness.te_twin.counters import kernel


class GemmError(RuntimeError):
    """An error the GPU GEMM raises (same message as TE's C++ check)."""


def _two_d(shape: list[int]) -> tuple[int, int]:
    if not shape:
        return 1, 1
    first = 1
    for s in shape[:-1]:
        first *= s
    return first, shape[-1]


def logical_shape(t: Any) -> list[int]:
    """The shape the C++ wrapper reports for an operand (row-wise data's, else derived from the
    column-wise copy's)."""
    kind = storage.family(t)
    if kind is None:
        return list(t.shape)
    if kind == "nvfp4":  # TE's Python size() warns for a column-wise-only one; the C++ shape does not
        return nvfp4.logical_shape(t)
    if kind == "float8" and t._data is None and t._transpose is not None:
        # The C++ Tensor::shape() of a column-wise-only FP8 tensor (common/common.h): the
        # transpose [last, *leading] rotated back. Not the Python size(), which before 2.1x
        # flattens an N-D one to [leading[-1], prod(rest)] (Megatron's [s, b, h] inputs)
        dims = list(t._transpose.shape)
        return dims[1:] + dims[:1]
    return list(t.shape) if isinstance(t, torch.Tensor) else list(t.size())


def operand(t: Any, transposed: bool, name: str) -> torch.Tensor:
    """op(t) as the float32 matrix the GEMM multiplies: for A `transposed` is transa, for B it is
    transb. Raises the GPU's error when the buffer it needs is missing."""
    kind = storage.family(t)
    if kind is None:
        m = storage.to_2d(t).float()
        return m.t() if transposed else m
    if kind == "float8":
        return _float8_operand(t, transposed, name)
    if kind in ("mxfp8", "block"):
        import importlib

        recipe = importlib.import_module("harness.te_twin." + {"mxfp8": "mxfp8", "block": "blockwise"}[kind])
        return recipe.gemm_operand(t, transposed, name)
    if kind == "nvfp4":  # both scale levels, for the callers that need an operand's values
        values, amax = nvfp4.gemm_operand(t, transposed, name)
        return values * (amax * torch.tensor(1.0 / (nvfp4.FP4_MAX * nvfp4.E4M3_MAX), dtype=torch.float32))
    raise NotImplementedError(f"the CPU twin of transformer_engine_torch has no GEMM for {type(t).__name__} operands")


def _float8_operand(t: Any, transposed: bool, name: str) -> torch.Tensor:
    fp8 = storage.fp8_dtype_of(t)
    scale_inv = t._scale_inv.reshape(-1)[0].float()
    has_data = t._data is not None
    has_columnwise = t._transpose is not None and not t._transpose_invalid
    # Which buffer cuBLAS reads: A's data is used as is when transposed ("T"), B's when not ("N")
    use_data = transposed if name == "A" else not transposed
    if not storage.non_tn_fp8_gemm_supported():
        if not use_data:
            if not has_columnwise:
                raise GemmError(f"Input {name} is missing column-wise usage")
            m = dtypes.decode_fp8(t._transpose, fp8).reshape(t._transpose.shape[0], -1)  # = op(t).T for A, op(t) for B
            out = m.t() if name == "A" else m
            return out * scale_inv
        if not has_data:
            raise GemmError(f"Input {name} is missing row-wise usage")
    elif not has_data:  # Blackwell: column-wise data with the mirrored flag
        if not has_columnwise:
            raise GemmError(f"Input {name} is missing column-wise usage")
        m = dtypes.decode_fp8(t._transpose, fp8).reshape(t._transpose.shape[0], -1)
        return (m if transposed else m.t()) * scale_inv
    m = storage.to_2d(dtypes.decode_fp8(t._data, fp8))
    return (m.t() if transposed else m) * scale_inv


def _lead_check(t: Any, name: str, transposed: bool) -> None:
    """cuBLAS's FP8 leading-dimension rule (cublaslt_gemm.cu: "Caller must pad.")."""
    if storage.family(t) != "float8":
        return
    rows, cols = _two_d(logical_shape(t))
    k = cols if (transposed if name == "A" else not transposed) else rows
    if k % 16:
        raise GemmError(f"Leading dimension requirement on {name} for FP8 GEMM. Caller must pad.")


def output_shape(a_shape: list[int], transa: bool, b_shape: list[int], transb: bool) -> list[int]:
    """getGemmOutputShape (gemm.cpp)."""
    a0, a1 = _two_d(a_shape)
    b0, b1 = _two_d(b_shape)
    if (a1 if transa else a0) != (b0 if transb else b1):
        raise GemmError(
            f"Invalid matrix dimensions for GEMM (A=({a0},{a1}), transa={transa}, B=({b0},{b1}), transb={transb})"
        )
    out = [b1] if transb else list(b_shape[:-1]) or [1]
    out.append(a0 if transa else a1)
    return out


def matmul(
    A: Any,
    transa: bool,
    B: Any,
    transb: bool,
    *,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    gelu_in: torch.Tensor | None = None,
    grad: bool = False,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The float32 result of one GEMM with its epilogue: (D, bias gradient, pre-GELU output)."""
    _lead_check(A, "A", transa)
    _lead_check(B, "B", transb)
    shape = output_shape(logical_shape(A), transa, logical_shape(B), transb)
    d = _product(A, transa, B, transb)
    if alpha != 1.0:
        d = d * alpha
    bias_grad = pre_gelu = None
    if grad:
        if gelu:  # DGELU(_BGRAD): the matmul output times dGELU of the saved forward input
            assert gelu_in is not None, "dGELU epilogue without its input"
            d = d * activations.dgelu_f32(storage.to_2d(gelu_in).float())
            if bias is not None:
                bias_grad = d.sum(0)
        elif bias is not None:  # BGRADB: the gradient of a bias added to B's rows
            bias_grad = storage.to_2d(_values(B)).sum(0)
    else:
        if bias is not None:
            d = d + bias.float().reshape(1, -1)
        if gelu:
            pre_gelu = d
            d = activations.gelu_f32(d)
    return d.reshape(shape), bias_grad, (None if pre_gelu is None else pre_gelu.reshape(shape))


def _product(A: Any, transa: bool, B: Any, transb: bool) -> torch.Tensor:
    """op(B) @ op(A) in float32."""
    families = (storage.family(A), storage.family(B))
    if "nvfp4" not in families:
        return operand(B, transb, "B") @ operand(A, transa, "A")
    if families != ("nvfp4", "nvfp4"):
        raise GemmError("Inputs A and B to GEMM need to have compatible scaling modes")
    a, amax_a = nvfp4.gemm_operand(A, transa, "A")
    b, amax_b = nvfp4.gemm_operand(B, transb, "B")
    return (b @ a) * nvfp4.per_tensor_alpha(amax_a, amax_b)


def _values(t: Any) -> torch.Tensor:
    """An operand's float32 values in its own (row-major) layout."""
    kind = storage.family(t)
    if kind is None:
        return t.float()
    return operand(t, False, "B")


_GEMM_ARGS = (
    "A", "transa", "B", "transb", "D", "quantizer", "output_dtype", "bias", "bias_type", "gelu", "gelu_in",
    "grad", "workspace", "workspace_size", "accumulate", "use_split_accumulator", "comm_overlap", "comm_type",
    "extra_output", "bulk_overlap", "alpha", "beta",
)  # fmt: skip


@kernel("generic_gemm")
def generic_gemm(*args: Any, **kwargs: Any) -> list[Any]:
    """tex.generic_gemm(A, transa, B, transb, D, quantizer, output_dtype, bias, bias_type, gelu,
    gelu_in, grad, workspace, workspace_size, accumulate, use_split_accumulator, comm_overlap=None,
    comm_type=None, extra_output=None, bulk_overlap=False, alpha=1.0, beta=None) (gemm.cpp `gemm`)
    -> [D, bias_grad, pre_gelu_out, extra_output]."""
    a = dict(zip(_GEMM_ARGS, args, strict=False))
    a.update({"transa": kwargs.pop("transA", a.get("transa")), "transb": kwargs.pop("transB", a.get("transb"))})
    a.update(kwargs)
    if a.get("comm_overlap") is not None:
        raise NotImplementedError("the CPU twin of transformer_engine_torch has no comm+GEMM overlap (userbuffers)")
    A, B, D, quantizer = a["A"], a["B"], a.get("D"), a.get("quantizer")
    transa, transb = bool(a["transa"]), bool(a["transb"])
    accumulate = bool(a.get("accumulate", False))
    beta = a.get("beta")
    beta = (1.0 if beta is None else beta) if accumulate else (0.0 if beta is None else beta)
    if not accumulate and beta != 0.0:
        raise GemmError(
            "Trying to use non-zero beta while not accumulating into D tensor. Beta has nothing to be applied to."
        )
    out_dtype = a.get("output_dtype")
    if out_dtype is None:
        out_dtype = A.dtype if storage.family(A) is None else torch.float32
    out_dtype = dtypes.to_torch(out_dtype)
    grad, gelu = bool(a.get("grad", False)), bool(a.get("gelu", False))
    d, bias_grad, pre_gelu = matmul(
        A,
        transa,
        B,
        transb,
        bias=a.get("bias"),
        gelu=gelu,
        gelu_in=a.get("gelu_in"),
        grad=grad,
        alpha=float(a.get("alpha", 1.0)),
    )
    if accumulate:
        if D is None:
            raise GemmError("accumulating into D needs D")
        d = d + beta * _values(D).reshape(d.shape)
    D = _write_output(d, D, quantizer, out_dtype, storage.family(A) == "float8" or storage.family(B) == "float8")
    if bias_grad is not None:
        bias_type = a.get("bias_type")
        bias_grad = storage.output(
            bias_grad, out_dtype if bias_type is None or storage.family(B) is None else dtypes.to_torch(bias_type)
        )
    if pre_gelu is not None:
        low_precision = storage.family(A) is not None or storage.family(B) is not None
        gelu_type = dtypes.to_torch(a["bias_type"]) if low_precision else out_dtype
        pre_gelu = storage.output(pre_gelu, gelu_type)
    return [D, bias_grad, pre_gelu, a.get("extra_output")]


def _write_output(d: torch.Tensor, D: Any, quantizer: Any, out_dtype: torch.dtype, per_tensor_inputs: bool) -> Any:
    """The GEMM's output as gemm.cpp makes it: a new tensor (quantized when there is a quantizer)
    or the given D. A delayed-scaling quantizer with per-tensor FP8 inputs is fused into the GEMM
    (FP8 written from the float32 result); any other quantizer runs after a GEMM in out_dtype."""
    from harness.te_twin import cast

    kind = storage.quantizer_kind(quantizer)
    if D is None and quantizer is None:
        return storage.output(d, out_dtype)
    if D is not None and storage.family(D) is None:  # cuBLAS writes the given output directly
        D.copy_(d.reshape(D.shape).to(D.dtype))
        return D
    if quantizer is None:
        raise GemmError("a quantized GEMM output needs its quantizer")
    fused = kind == "delayed" and per_tensor_inputs
    source = d if fused else storage.output(d, out_dtype)  # unfused: a high-precision output first
    return cast.quantize_new(source, quantizer) if D is None else cast.quantize_into(source, quantizer, D)


_GROUPED_ARGS = (
    "A", "transa", "B", "transb", "D", "D_type", "m_splits", "bias", "bias_type", "single_output", "pre_gelu_out",
    "grad", "workspace", "workspace_size", "accumulate", "use_split_accumulator", "math_sm_count",
)  # fmt: skip


@kernel("te_general_grouped_gemm")
def te_general_grouped_gemm(*args: Any, **kwargs: Any) -> Any:
    """tex.te_general_grouped_gemm (gemm.cpp): one GEMM per (A[i], B[i]) with the same flags, into
    D[i] (or consecutive rows of D[0] with single_output); bias gradients are written into bias[i];
    returns bias."""
    a = dict(zip(_GROUPED_ARGS, args, strict=False))
    a.update(kwargs)
    A, B, D, biases, pre_gelus = a["A"], a["B"], a["D"], a["bias"], a["pre_gelu_out"]
    transa, transb = bool(a["transa"]), bool(a["transb"])
    grad, accumulate, single = bool(a["grad"]), bool(a["accumulate"]), bool(a["single_output"])
    out_dtype = dtypes.to_torch(a["D_type"])
    if single and D is None:
        raise GemmError("not implemented, D should be allocated for single output case.")
    outputs: list[torch.Tensor] = []
    offset = 0
    for i in range(len(A)):
        shape = output_shape(logical_shape(A[i]), transa, logical_shape(B[i]), transb)
        rows, cols = _two_d(shape)
        if single:
            flat = D[0].reshape(-1)
            out = flat[offset : offset + rows * cols].view(shape)
            offset += rows * cols
        elif D is None:
            out = storage.empty(shape, out_dtype)
            outputs.append(out)
        else:
            out = D[i]
        bias = biases[i] if biases[i].numel() else None
        gelu = pre_gelus[i].numel() != 0
        if rows * cols == 0 or _numel(A[i]) == 0 or _numel(B[i]) == 0:
            if out.numel() and not accumulate:
                out.zero_()
            if bias is not None and grad:
                bias.zero_()
            continue
        d, _bias_grad, pre_gelu = matmul(
            A[i], transa, B[i], transb, bias=None if grad else bias, gelu=gelu and not grad,
            gelu_in=pre_gelus[i] if grad and gelu else None, grad=grad,
        )  # fmt: skip
        if grad and bias is not None:
            values = storage.to_2d(_values(B[i])) if not gelu else storage.to_2d(d)
            bias.copy_(values.sum(0).to(bias.dtype))
        if accumulate:
            d = d + out.float().reshape(d.shape)
        out.copy_(d.reshape(out.shape).to(out.dtype))
        if pre_gelu is not None:
            pre_gelus[i].copy_(pre_gelu.reshape(pre_gelus[i].shape).to(pre_gelus[i].dtype))
    return outputs if D is None else biases


def _numel(t: Any) -> int:
    rows, cols = _two_d(logical_shape(t))
    return rows * cols
