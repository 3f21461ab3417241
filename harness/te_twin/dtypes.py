"""TE's data types as the extension names them, and the FP8 cast the GPU performs.

Values are transformer_engine::DType's (common/include/transformer_engine/transformer_engine.h:
kByte 0 ... kFloat8E5M2 8, kFloat8E8M0 9, kFloat4E2M1 10). The extension's pybind enum lists a
subset (common/util/pybind_helper.h: kFloat4E2M1 from 2.8); TE 2.20's Python checks that its own
mirror names exactly the extension's members, so the subset is per release.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

VALUES = {
    "kByte": 0,
    "kInt16": 1,
    "kInt32": 2,
    "kInt64": 3,
    "kFloat32": 4,
    "kFloat16": 5,
    "kBFloat16": 6,
    "kFloat8E4M3": 7,
    "kFloat8E5M2": 8,
    "kFloat8E8M0": 9,
    "kFloat4E2M1": 10,
}
_BOUND = ("kByte", "kInt32", "kFloat32", "kFloat16", "kBFloat16", "kFloat8E4M3", "kFloat8E5M2")

E4M3, E5M2 = VALUES["kFloat8E4M3"], VALUES["kFloat8E5M2"]
TORCH = {
    0: torch.uint8,
    2: torch.int32,
    3: torch.int64,
    4: torch.float32,
    5: torch.float16,
    6: torch.bfloat16,
    7: torch.float8_e4m3fn,
    8: torch.float8_e5m2,
    9: torch.float8_e8m0fnu,
}
FROM_TORCH = {v: k for k, v in TORCH.items()}
# Largest finite values (Quantized_Limits<T>::max_norm, common/util/...; fp8_dtype_max in
# common/recipe/delayed_scaling.cu)
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
FLOAT32_MAX = torch.finfo(torch.float32).max


def make_enum(release: tuple[int, ...]) -> type[enum.IntEnum]:
    """The extension's `DType` enum of a release (its members as pybind_helper.h binds them)."""
    names = [*_BOUND, *(["kFloat4E2M1"] if release >= (2, 8) else [])]
    return enum.IntEnum("DType", {n: VALUES[n] for n in names}, module="transformer_engine_torch")  # type: ignore[return-value]


def value(dtype: Any) -> int:
    """The integer of a TE dtype (the extension's enum, TE's Python mirror, or a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        return FROM_TORCH[dtype]
    return int(dtype)


def to_torch(dtype: Any) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else TORCH[int(dtype)]


def is_fp8(dtype: Any) -> bool:
    return value(dtype) in FP8_MAX


def cast_fp8(x: torch.Tensor, scale: torch.Tensor | float, fp8: int) -> torch.Tensor:
    """`static_cast<fp8>(float(x) * scale)` as TE's cast kernels do on the GPU: float32 product,
    round to nearest even, saturated to the largest finite value (the CUDA fp8 constructors convert
    with __NV_SATFINITE); NaN stays NaN. Returns the bytes as uint8, the way TE stores them."""
    limit = FP8_MAX[fp8]
    scaled = x.float() * scale
    return scaled.clamp(-limit, limit).to(TORCH[fp8]).view(torch.uint8)


def decode_fp8(data: torch.Tensor, fp8: int) -> torch.Tensor:
    """The float32 values of FP8 bytes (uint8 storage)."""
    return data.view(TORCH[fp8]).float()


def amax(x: torch.Tensor) -> torch.Tensor:
    """max(|x|) in float32, 0 for an empty tensor, NaNs passed over as CUDA's fmaxf does
    (common/recipe/current_scaling.cu amax_kernel; the cast kernels' amax likewise)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32)
    a = x.detach().abs().float()
    return torch.where(torch.isnan(a), torch.zeros((), dtype=torch.float32), a).max()


def scale_from_amax(amax_value: float, fp8_max: float, force_pow_2: bool, epsilon: float) -> float:
    """compute_scale_from_amax (common/recipe/recipe_common.cuh), in float32: the scale that maps
    amax to the format's largest value; 1 for a zero / inf / NaN amax; float32 max if it overflows;
    optionally rounded down to a power of two (mantissa bits cleared)."""
    a = torch.tensor(amax_value, dtype=torch.float32)
    if bool(a < epsilon):
        a = torch.tensor(epsilon, dtype=torch.float32)
    if bool(torch.isinf(a)) or bool(a == 0) or bool(torch.isnan(a)):
        return 1.0
    scale = torch.tensor(fp8_max, dtype=torch.float32) / a
    if bool(torch.isinf(scale)):
        scale = torch.tensor(FLOAT32_MAX, dtype=torch.float32)
    if force_pow_2:
        bits = scale.view(torch.int32) & torch.tensor(-8388608, dtype=torch.int32)  # 0xFF800000
        scale = bits.view(torch.float32)
    return float(scale)


def scales_from_amax(
    amax_values: torch.Tensor, fp8_max: float, force_pow_2: bool, epsilon: float, value_for_inf: float = FLOAT32_MAX
) -> torch.Tensor:
    """`scale_from_amax` elementwise over a float32 tensor of amaxes (one per block or tile); an
    infinite scale becomes `value_for_inf` (compute_scale_from_types: the input type's largest)."""
    a = amax_values.float()
    a = torch.where(a < epsilon, torch.tensor(epsilon, dtype=torch.float32), a)
    bad = torch.isinf(a) | (a == 0) | torch.isnan(a)
    scale = torch.tensor(fp8_max, dtype=torch.float32) / torch.where(bad, torch.ones((), dtype=torch.float32), a)
    scale = torch.where(torch.isinf(scale), torch.tensor(value_for_inf, dtype=torch.float32), scale)
    if force_pow_2:
        scale = (scale.view(torch.int32) & torch.tensor(-8388608, dtype=torch.int32)).view(torch.float32)
    return torch.where(bad, torch.ones((), dtype=torch.float32), scale)
