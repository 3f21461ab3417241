"""Stand-ins for Transformer Engine's weight caches, for what cannot use TE's real classes.

TE's real Python code is tested release by release in tests/te/test_te_real.py (harness/te_import.py
imports it from the PyPI wheels). These remain for two reasons only:
- TE before 1.9 has no wheel with its Python code, and TE 1.x's `Float8Tensor` cannot be built on
  CPU at all (its constructor moves the data with `.cuda()`): `Float8TensorV1`, `attach_legacy`;
- the demo, the benchmarks and the framework tests run in processes that do not import TE: they
  need a cache value with TE's fields, made on CPU (`Float8TensorV2`, `Float8BlockwiseQTensorV2`).
The field names are not typed here: they are `harness/te_releases.FIELDS`, which the real-TE tests
check against the fields of TE's own classes in every release that has them. They hold real tensors,
so byte counts and frees are real; they implement no TE math.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_releases import FIELDS

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
    def __new__(cls, shape: torch.Size, dtype: torch.dtype, device: torch.device, **_: Any) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device, requires_grad=False)

    @classmethod  # torch's stubs type Tensor's as a plain function; subclasses define a classmethod (torch docs)
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise NotImplementedError(f"stand-in {cls.__name__} implements no op ({func})")


class Float8TensorV1(_Wrapper):
    """TE 1.x `Float8Tensor` (transformer_engine/pytorch/float8_tensor.py v1.7, tensor/float8_tensor.py
    v1.13; not buildable on CPU from the real wheels): `_data` is an attribute, `_transpose` and
    `_scale_inv` are properties over the `_fp8_attrs` dict shared between tensors with the same data."""

    _data: torch.Tensor
    _fp8_attrs: dict[str, Any]

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


class Float8TensorV2(_Wrapper):
    """TE 2.x `Float8Tensor`: a torch.Tensor wrapper whose bytes live in FIELDS["Float8Tensor"]
    (data, transpose, scale-inverse)."""

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        data, transpose, scale_inv = FIELDS["Float8Tensor"]
        setattr(self, data, _fp8_bytes(weight))
        setattr(self, transpose, _fp8_bytes(weight.t().contiguous()))
        setattr(self, scale_inv, _scale(weight.device))
        self._quantizer = None
        return self


class Float8BlockwiseQTensorV2(_Wrapper):
    """TE 2.3+ `Float8BlockwiseQTensor`, the class verl issue #6953 counted ~3,900 of per rank: four
    inner tensors, FIELDS["Float8BlockwiseQTensor"] (row/column data, row/column scale-inverse)."""

    block = 128

    def __new__(cls, weight: torch.Tensor) -> Any:
        self = super().__new__(cls, weight.shape, weight.dtype, weight.device)
        rows, cols = weight.shape
        row_data, col_data, row_scale, col_scale = FIELDS["Float8BlockwiseQTensor"]
        setattr(self, row_data, _fp8_bytes(weight))
        setattr(self, col_data, _fp8_bytes(weight.t().contiguous()))
        u8: dict[str, Any] = {"dtype": torch.uint8, "device": weight.device}
        setattr(self, row_scale, torch.ones(rows, max(1, cols // self.block), **u8))
        setattr(self, col_scale, torch.ones(cols, max(1, rows // self.block), **u8))
        self._quantizer = None
        return self


def inner_tensors(value: Any) -> list[torch.Tensor]:
    """The stand-ins' own byte holders, listed by class (the test oracle)."""
    if isinstance(value, Float8TensorV1):
        names: tuple[str, ...] = ("_data", "_transpose", "_scale_inv")
    else:
        names = FIELDS["Float8Tensor" if isinstance(value, Float8TensorV2) else "Float8BlockwiseQTensor"]
    found = [getattr(value, n) for n in names]
    return [t for t in found if t is not None]


# --- module layouts -----------------------------------------------------------------------------


def attach_workspaces(module: torch.nn.Module, entries: dict[str, Any]) -> None:
    """TE >= 1.8 layout (module/base.py v1.8 - main): `self._fp8_workspaces: Dict[str, ...]`, a
    plain dict in the instance `__dict__`, filled on forward when `is_first_microbatch` is not None."""
    module.__dict__.setdefault("_fp8_workspaces", {}).update(entries)


def attach_legacy(module: torch.nn.Module, weights: list[torch.Tensor]) -> None:
    """TE before 1.8 (0.x - 1.7) layout (module/base.py v1.7 `set_fp8_weights`): `fp8_weight_shapes` plus
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


class SealedLinearStandIn(TELinearStandIn):
    """A TE-like layer whose `__dict__` raises while the class is sealed (a proxy, a C++-backed
    module...). `sealed` is the class's: a test sets it and puts it back in a `finally`."""

    sealed = False

    @property
    def __dict__(self) -> dict:  # type: ignore[override]  # deliberately: a __dict__ that raises
        if SealedLinearStandIn.sealed:
            raise RuntimeError("sealed module")
        return torch.nn.Module.__dict__["__dict__"].__get__(self)


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
