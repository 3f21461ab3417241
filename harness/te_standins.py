"""Stand-ins for Transformer Engine's weight-cache layouts, one per TE era.

TE cannot be installed without CUDA, so these reproduce the attribute layout the shim reads, each
naming the TE release and source file it mirrors (NVIDIA/TransformerEngine; facts re-checked with
`git show TAG:path`). They hold real tensors, so byte counts and frees are real; they implement no
TE math.
"""

from __future__ import annotations

from typing import Any

import torch

FP8 = torch.float8_e4m3fn


def _fp8_bytes(weight: torch.Tensor) -> torch.Tensor:
    """A real FP8 copy of `weight` as uint8 storage: one byte per element, like TE's `_data`."""
    return weight.detach().to(FP8).view(torch.uint8).clone()


def _scale(device: torch.device | str) -> torch.Tensor:
    return torch.ones(1, dtype=torch.float32, device=device)


# --- value classes ------------------------------------------------------------------------------


class _Wrapper(torch.Tensor):
    """A wrapper subclass like TE's: the wrapper owns no bytes (`untyped_storage()` is empty)."""

    @staticmethod
    def __new__(cls, shape: torch.Size, dtype: torch.dtype, device: torch.device | str, **_: Any) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device, requires_grad=False)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(f"stand-in {cls.__name__} implements no op ({func})")


class Float8TensorV1(_Wrapper):
    """TE 1.0 - 1.13 `Float8Tensor` (transformer_engine/pytorch/float8_tensor.py v1.7;
    tensor/float8_tensor.py v1.13): `_data` is an attribute, `_transpose` and `_scale_inv` are
    properties over the `_fp8_attrs` dict shared between tensors with the same data."""

    def __new__(cls, weight: torch.Tensor, *, with_transpose: bool = True, fp8_attrs: dict | None = None) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        self._data = _fp8_bytes(weight)
        self._fp8_attrs = fp8_attrs if fp8_attrs is not None else {}
        self._fp8_attrs.setdefault("scale_inv", _scale(weight.device))
        self._fp8_attrs["transpose"] = _fp8_bytes(weight.t().contiguous()) if with_transpose else None
        return self

    @property
    def _transpose(self) -> torch.Tensor | None:
        return self._fp8_attrs["transpose"]

    @property
    def _scale_inv(self) -> torch.Tensor:
        return self._fp8_attrs["scale_inv"]


class Float8TensorBaseV2_3:
    """TE 2.0 - 2.3 `Float8TensorBase` (tensor/_internal/float8_tensor_base.py v2.3): a plain
    object, not a torch.Tensor, made with `object.__new__`."""

    def __init__(self, weight: torch.Tensor) -> None:
        self._data = _fp8_bytes(weight)
        self._transpose = _fp8_bytes(weight.t().contiguous())
        self._scale_inv = _scale(weight.device)
        self._fp8_dtype = "kFloat8E4M3"
        self._quantizer = object()

    def get_metadata(self) -> dict[str, Any]:
        return {
            "data": self._data,
            "fp8_scale_inv": self._scale_inv,
            "fp8_dtype": self._fp8_dtype,
            "data_transpose": self._transpose,
            "quantizer": self._quantizer,
        }


class _RowColumnStorage:
    """The four-tensor storage of MXFP8 / Float8Blockwise (tensor/_internal/*_tensor_base.py v2.0 - 2.8,
    tensor/storage/*_tensor_storage.py v2.9+)."""

    block = 32

    def _fill(self, weight: torch.Tensor) -> None:
        rows, cols = weight.shape
        self._rowwise_data = _fp8_bytes(weight)
        self._columnwise_data = _fp8_bytes(weight)
        self._rowwise_scale_inv = torch.ones(rows, max(1, cols // self.block), dtype=torch.uint8, device=weight.device)
        self._columnwise_scale_inv = torch.ones(
            max(1, rows // self.block), cols, dtype=torch.uint8, device=weight.device
        )
        self._quantizer = object()

    def get_metadata(self) -> dict[str, Any]:
        return {
            "rowwise_data": self._rowwise_data,
            "rowwise_scale_inv": self._rowwise_scale_inv,
            "columnwise_data": self._columnwise_data,
            "columnwise_scale_inv": self._columnwise_scale_inv,
            "fp8_dtype": "kFloat8E4M3",
            "quantizer": self._quantizer,
        }


class MXFP8TensorBaseV2_3(_RowColumnStorage):
    """TE 2.0 - 2.3 `MXFP8TensorBase` (tensor/_internal/mxfp8_tensor_base.py v2.3): plain object."""

    def __init__(self, weight: torch.Tensor) -> None:
        self._fill(weight)


class Float8BlockwiseQTensorBaseV2_3(_RowColumnStorage):
    """TE 2.3 `Float8BlockwiseQTensorBase` (tensor/_internal/float8_blockwise_tensor_base.py v2.3)."""

    block = 128

    def __init__(self, weight: torch.Tensor) -> None:
        self._fill(weight)
        self._is_2D_scaled = True

    def get_metadata(self) -> dict[str, Any]:
        return {**super().get_metadata(), "is_2D_scaled": self._is_2D_scaled}


class Float8TensorV2(_Wrapper):
    """TE 2.4+ `Float8Tensor(Float8TensorStorage, QuantizedTensor)` (tensor/float8_tensor.py v2.14):
    a torch.Tensor wrapper whose bytes live in `_data`, `_transpose`, `_scale_inv`."""

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        Float8TensorBaseV2_3.__init__(self, weight)  # type: ignore[arg-type]
        return self

    get_metadata = Float8TensorBaseV2_3.get_metadata


class MXFP8TensorV2(_Wrapper, _RowColumnStorage):
    """TE 2.4+ `MXFP8Tensor` (tensor/mxfp8_tensor.py v2.14)."""

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        self._fill(weight)
        return self


class Float8BlockwiseQTensorV2(_Wrapper, _RowColumnStorage):
    """TE 2.4+ `Float8BlockwiseQTensor` (tensor/float8_blockwise_tensor.py v2.14): the class verl
    issue #6953 counted ~3,900 of per rank."""

    block = 128

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        self._fill(weight)
        return self


class NVFP4TensorV2(_Wrapper, _RowColumnStorage):
    """TE 2.8+ `NVFP4Tensor` (tensor/nvfp4_tensor.py v2.8; storage/nvfp4_tensor_storage.py v2.9+):
    packed 4-bit data plus per-direction amax."""

    block = 16

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        self._fill(weight)
        rows, cols = weight.shape
        self._rowwise_data = torch.zeros(rows, max(1, cols // 2), dtype=torch.uint8, device=weight.device)
        self._columnwise_data = torch.zeros(cols, max(1, rows // 2), dtype=torch.uint8, device=weight.device)
        self._amax_rowwise = torch.ones(1, dtype=torch.float32, device=weight.device)
        self._amax_columnwise = torch.ones(1, dtype=torch.float32, device=weight.device)
        return self

    def get_metadata(self) -> dict[str, Any]:
        return {**super().get_metadata(), "amax_rowwise": self._amax_rowwise, "amax_columnwise": self._amax_columnwise}


class GroupedTensorStorageMain:
    """TE main `GroupedTensorStorage` (tensor/storage/grouped_tensor_storage.py, after v2.18):
    public field names, no `get_metadata`; `quantized_tensors` are views into the grouped data."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        flat = torch.cat([w.detach().reshape(-1) for w in weights])
        self.rowwise_data = _fp8_bytes(flat)
        self.columnwise_data = _fp8_bytes(flat)
        self.scale_inv = torch.ones(len(weights), dtype=torch.float32, device=flat.device)
        self.columnwise_scale_inv = torch.ones(len(weights), dtype=torch.float32, device=flat.device)
        self.amax = None
        self.quantizer = object()
        sizes = [w.numel() for w in weights]
        self.quantized_tensors = list(torch.split(self.rowwise_data, sizes))
        self.num_tensors = len(weights)


class HybridQuantizedTensorStorageMain:
    """TE main `HybridQuantizedTensorStorage` (tensor/storage/hybrid_tensor_storage.py): two nested
    storages, one per direction."""

    def __init__(self, rowwise: Any, columnwise: Any) -> None:
        self._rowwise_storage = rowwise
        self._columnwise_storage = columnwise
        self._quantizer = object()

    def get_metadata(self) -> dict[str, Any]:
        return {
            "rowwise_storage": self._rowwise_storage,
            "columnwise_storage": self._columnwise_storage,
            "quantizer": self._quantizer,
        }


class DebugQuantizedTensorMain:
    """TE `DebugQuantizedTensor` (transformer_engine/debug/pytorch/debug_quantization.py, v2.3+):
    wraps the tensors used by the GEMMs; both directions may be the same object. Its inherited
    `get_metadata` is abstract."""

    def __init__(self, rowwise: Any, columnwise: Any) -> None:
        self.rowwise_gemm_tensor = rowwise
        self.columnwise_gemm_tensor = columnwise
        self.quantizer = object()

    def get_metadata(self) -> dict[str, Any]:
        raise NotImplementedError


def inner_tensors(value: Any) -> list[torch.Tensor]:
    """The stand-ins' own byte holders, listed by hand per class (the test oracle)."""
    names = {
        Float8TensorV1: ("_data", "_transpose", "_scale_inv"),
        Float8TensorBaseV2_3: ("_data", "_transpose", "_scale_inv"),
        Float8TensorV2: ("_data", "_transpose", "_scale_inv"),
        MXFP8TensorBaseV2_3: _ROWCOL,
        Float8BlockwiseQTensorBaseV2_3: _ROWCOL,
        MXFP8TensorV2: _ROWCOL,
        Float8BlockwiseQTensorV2: _ROWCOL,
        NVFP4TensorV2: (*_ROWCOL, "_amax_rowwise", "_amax_columnwise"),
        GroupedTensorStorageMain: ("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv"),
    }
    if isinstance(value, HybridQuantizedTensorStorageMain):
        return inner_tensors(value._rowwise_storage) + inner_tensors(value._columnwise_storage)
    if isinstance(value, DebugQuantizedTensorMain):
        return inner_tensors(value.rowwise_gemm_tensor) + inner_tensors(value.columnwise_gemm_tensor)
    found = [getattr(value, n) for n in names[type(value)]]
    return [t for t in found if t is not None]


_ROWCOL = ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv")


# --- module layouts -----------------------------------------------------------------------------


def attach_workspaces(module: torch.nn.Module, entries: dict[str, Any]) -> None:
    """TE >= 1.8 layout (module/base.py v1.8 - main): `self._fp8_workspaces: Dict[str, ...]`, a
    plain dict in the instance `__dict__`, filled on forward when `is_first_microbatch` is not None."""
    module.__dict__.setdefault("_fp8_workspaces", {}).update(entries)


def attach_legacy(module: torch.nn.Module, weights: list[torch.Tensor]) -> None:
    """TE 1.0 - 1.7 layout (module/base.py v1.7 `set_fp8_weights`): `fp8_weight_shapes` plus
    plain attributes `weight{i}_fp8`, `weight{i}_t_fp8`, i from 1."""
    module.__dict__["fp8_weight_shapes"] = [w.shape for w in weights]
    for i, w in enumerate(weights, start=1):
        module.__dict__[f"weight{i}_fp8"] = Float8TensorV1(w, with_transpose=False)
        module.__dict__[f"weight{i}_t_fp8"] = Float8TensorV1(w.t().contiguous(), with_transpose=False)


class TELinearStandIn(torch.nn.Module):
    """A module shaped like TE >= 1.8 `Linear` (module/linear.py): a weight and a workspace dict."""

    def __init__(self, rows: int, cols: int, device: str = "cpu") -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(rows, cols, device=device))
        self._fp8_workspaces: dict[str, Any] = {}


class GroupedLinearStandIn(torch.nn.Module):
    """TE 1.9+ `GroupedLinear` (module/grouped_linear.py): one weight per expert, keys weight0..N-1."""

    def __init__(self, experts: int, rows: int, cols: int, device: str = "cpu") -> None:
        super().__init__()
        for i in range(experts):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(torch.randn(rows, cols, device=device)))
        self.num_gemms = experts
        self._fp8_workspaces: dict[str, Any] = {}


def fill_like_forward(module: torch.nn.Module, value_class: Any = Float8TensorV2) -> int:
    """Fill a stand-in's workspace the way its forward would (keys by module kind). Returns entries."""
    ws = module.__dict__["_fp8_workspaces"]
    if isinstance(module, GroupedLinearStandIn):
        for i in range(module.num_gemms):
            ws[f"weight{i}"] = value_class(getattr(module, f"weight{i}"))
    else:
        ws["weight"] = value_class(module.weight)
    return len(ws)
