"""TE's Python tensor objects as its C++ builds and reads them.

The extension recognises a quantizer or a quantized tensor by its Python class (pybind.cpp
`init_extension` looks the classes up by module and name; `IsFloat8Tensor` etc. compare types) and
builds its outputs by calling those classes with keyword arguments (csrc/quantizer.cpp
`*Quantizer::create_tensor`). The keywords changed over releases (2.10 added `device`, 2.16+
`fake_dtype` / `stride`): `construct` passes an optional keyword only when the class's own
constructors name it, so one code path builds what each release's C++ built.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from harness.te_twin import dtypes

# Class families, by the class names their C++ recognises (a subclass is of its base's family).
_TENSOR_FAMILIES = (
    ("Float8BlockwiseQTensor", "block"),
    ("MXFP8Tensor", "mxfp8"),
    ("NVFP4Tensor", "nvfp4"),
    ("Float8Tensor", "float8"),
    ("GroupedTensor", "grouped"),
)
_QUANTIZERS = {
    "Float8Quantizer": "delayed",
    "Float8CurrentScalingQuantizer": "current",
    "MXFP8Quantizer": "mxfp8",
    "Float8BlockQuantizer": "block",
    "NVFP4Quantizer": "nvfp4",
}
# The keyword arguments a constructor may lack in older releases (dropped when it does).
_OPTIONAL = ("device", "fake_dtype", "stride", "with_gemm_swizzled_scales", "requires_grad", "data_format")


def family(obj: Any) -> str | None:
    """'float8' / 'mxfp8' / 'block' / 'nvfp4' / 'grouped' for TE's quantized values (tensor or
    storage class), None for anything else (a plain tensor)."""
    cls: Any = type(obj)
    return _family_of(cls)


@functools.cache
def _family_of(cls: type) -> str | None:
    for klass in cls.__mro__:
        name = klass.__name__
        for prefix, kind in _TENSOR_FAMILIES:
            if name in (prefix, prefix + "Base", prefix + "Storage"):
                return kind
    return None


def quantizer_kind(quantizer: Any) -> str | None:
    """The C++ quantizer class the extension converts `quantizer` to (convert_quantizer,
    csrc/common.cpp); None for no quantizer (NoneQuantizer: high-precision output)."""
    if quantizer is None:
        return None
    for klass in type(quantizer).__mro__:
        if klass.__name__ in _QUANTIZERS:
            return _QUANTIZERS[klass.__name__]
    raise NotImplementedError(
        f"the CPU twin of transformer_engine_torch has no quantizer conversion for {type(quantizer).__name__}"
    )


@functools.cache
def _named_parameters(cls: type) -> frozenset[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is torch.Tensor or klass is object:
            break
        for method in ("__new__", "__init__"):
            func = klass.__dict__.get(method)
            if func is None:
                continue
            func = getattr(func, "__func__", func)
            try:
                params = inspect.signature(func).parameters.values()
            except (TypeError, ValueError):
                continue
            names.update(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return frozenset(names)


def construct(cls: type, **kwargs: Any) -> Any:
    """`cls(**kwargs)`, less the optional keywords no constructor of `cls` names."""
    named = _named_parameters(cls)
    for key in _OPTIONAL:
        if key in kwargs and key not in named:
            del kwargs[key]
    return cls(**kwargs)


def te_class(name: str) -> type:
    """A TE tensor / storage class by name, from where the release defines it (the extension's
    init_extension imports the same modules)."""
    import importlib
    import sys

    where = {
        "Float8Tensor": ("tensor.float8_tensor",),
        "Float8TensorStorage": ("tensor.storage.float8_tensor_storage", "tensor._internal.float8_tensor_base"),
        "MXFP8Tensor": ("tensor.mxfp8_tensor",),
        "MXFP8TensorStorage": ("tensor.storage.mxfp8_tensor_storage", "tensor._internal.mxfp8_tensor_base"),
        "Float8BlockwiseQTensor": ("tensor.float8_blockwise_tensor",),
        "Float8BlockwiseQTensorStorage": (
            "tensor.storage.float8_blockwise_tensor_storage",
            "tensor._internal.float8_blockwise_tensor_base",
        ),
        "NVFP4Tensor": ("tensor.nvfp4_tensor",),
        "NVFP4TensorStorage": ("tensor.storage.nvfp4_tensor_storage", "tensor._internal.nvfp4_tensor_base"),
        "GroupedTensor": ("tensor.grouped_tensor",),
        "GroupedTensorStorage": ("tensor.storage.grouped_tensor_storage",),
    }[name]
    for module_name in where:
        full = f"transformer_engine.pytorch.{module_name}"
        try:
            module = sys.modules.get(full) or importlib.import_module(full)
        except ImportError:
            continue
        for candidate in (name, name.replace("Storage", "Base")):
            cls = getattr(module, candidate, None)
            if isinstance(cls, type):
                return cls
    raise LookupError(f"TE class {name} not found in this release")


def python_dtype(value: int) -> Any:
    """What the C++ hands Python as an FP8 dtype: TE's Python `DType` mirror where the release has
    one (2.20: csrc/common.cpp MakePythonDType), else the extension's own enum member."""
    import sys

    constants = sys.modules.get("transformer_engine.pytorch.constants")
    mirror = getattr(constants, "DType", None)
    extension = sys.modules["transformer_engine_torch"].DType
    if isinstance(mirror, type) and mirror is not extension:
        return mirror(value)
    return extension(value)


def shape_of(tensor: Any) -> list[int]:
    return list(tensor.shape)


def transpose_shape(shape: list[int]) -> list[int]:
    """make_transpose_shape (csrc/quantizer.cpp): the last dimension first, then the others."""
    return [shape[-1], *shape[:-1]] if shape else []


def nothing_to_quantize(x: torch.Tensor, noop: torch.Tensor | None) -> bool:
    """Whether a quantize kernel returns without writing: every kernel of TE's cast checks the
    no-op flag first (1.0: skip), and an empty input has nothing to cast."""
    return (noop is not None and float(noop.reshape(-1)[0]) == 1.0) or x.numel() == 0


def to_2d(t: torch.Tensor) -> torch.Tensor:
    """A tensor as the 2-D matrix TE's kernels see: all dimensions but the last flattened."""
    if t.dim() == 2:
        return t
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])


def non_tn_fp8_gemm_supported() -> bool:
    """nvte_is_non_tn_fp8_gemm_supported (common/util/cuda_runtime): Blackwell (sm100+) only."""
    from harness.te_twin import device

    return device.arch() >= 100


def empty(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A new device tensor, as the C++ allocates its outputs (at::empty on CUDA)."""
    return torch.empty(shape, dtype=dtype, device="cuda")


def output(values: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` in a new device tensor of `dtype` (a kernel's output, allocated as the C++ does)."""
    out = empty(list(values.shape), values.dtype if dtype is None else dtype)
    out.copy_(values)
    return out


def fp8_dtype_of(obj: Any) -> int:
    return dtypes.value(obj._fp8_dtype)


def contiguous_stride(shape: list[int]) -> list[int]:
    """The row-major strides of `shape`, as create_tensor passes them (2.16+ `stride`)."""
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    return stride


def new_quantized(class_name: str, quantizer: Any, shape: list[int], fake_dtype: torch.dtype, fields: dict) -> Any:
    """The object create_tensor returns: the storage class (`<class_name>Storage`) for an internal
    quantizer, else the tensor class itself with the tensor's shape, dtype and strides."""
    if quantizer.internal:
        return construct(te_class(class_name + "Storage"), **fields, fake_dtype=fake_dtype)
    return construct(
        te_class(class_name),
        shape=list(shape),
        dtype=fake_dtype,
        stride=contiguous_stride(shape),
        device=torch.device("cpu"),
        **fields,
    )


# A direction's shape, by `columnwise` (row-wise False), for the two helpers below.
DirectionShape = Callable[[bool], list[int]]


def new_direction_buffers(
    quantizer: Any, data_shape: DirectionShape, scale_shape: DirectionShape, scale_dtype: torch.dtype
) -> dict[str, Any]:
    """create_tensor's buffers of a block-scaled tensor (MXFP8, FP8 block): uint8 data and its
    scale-inverses for each direction the quantizer uses, None for the others."""
    fields: dict[str, Any] = {
        "rowwise_data": None,
        "rowwise_scale_inv": None,
        "columnwise_data": None,
        "columnwise_scale_inv": None,
    }
    for direction, columnwise in (("rowwise", False), ("columnwise", True)):
        if getattr(quantizer, f"{direction}_usage"):
            fields[f"{direction}_data"] = empty(data_shape(columnwise), torch.uint8)
            fields[f"{direction}_scale_inv"] = empty(scale_shape(columnwise), scale_dtype)
    return fields


def update_direction_buffers(
    tensor: Any, quantizer: Any, data_shape: DirectionShape, scale_shape: DirectionShape, scale_dtype: torch.dtype
) -> None:
    """convert_and_update_tensor's buffers of a block-scaled tensor: for each direction the
    quantizer uses, the missing data or scale-inverses allocated (shapes asked for only then); for
    each other direction, both dropped."""
    for direction, columnwise in (("rowwise", False), ("columnwise", True)):
        data, scale_inv = f"_{direction}_data", f"_{direction}_scale_inv"
        if getattr(quantizer, f"{direction}_usage"):
            if getattr(tensor, data) is None:
                setattr(tensor, data, empty(data_shape(columnwise), torch.uint8))
            if getattr(tensor, scale_inv) is None:
                setattr(tensor, scale_inv, empty(scale_shape(columnwise), scale_dtype))
        else:
            setattr(tensor, data, None)
            setattr(tensor, scale_inv, None)
