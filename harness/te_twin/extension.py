"""The twin `transformer_engine_torch` module: the enums and classes TE's Python reads, and the
kernels of this package.

A name TE asks for that the twin does not implement raises `MissingKernel` naming it, at the
moment TE reads it: never a stand-in that returns something. `MissingKernel` is also an
AttributeError, so TE's own feature probes (`hasattr(tex, ...)`) see the name as absent; every such
read is recorded in `missing` (tests check that a run read none they did not expect).
"""

from __future__ import annotations

import ast
import enum
import types
from pathlib import Path
from typing import Any

from harness.te_twin import activations, cast, dtypes, gemm, norms, recipe
from harness.te_twin.counters import kernel

# Enums bound by the extension (pybind.cpp; common/util/pybind_helper.h), values from the C++
# headers (transformer_engine.h, fused_attn.h, comm_gemm_overlap.h). Members TE does not read on
# the paths the twin runs (attention, comm overlap) are listed so its imports and dict literals work.
_ENUMS: dict[str, dict[str, int]] = {
    "FP8FwdTensors": {
        "GEMM1_INPUT": 0, "GEMM1_WEIGHT": 1, "GEMM1_OUTPUT": 2, "GEMM2_INPUT": 3, "GEMM2_WEIGHT": 4,
        "GEMM2_OUTPUT": 5, "GEMM3_INPUT": 6, "GEMM3_WEIGHT": 7, "GEMM3_OUTPUT": 8,
    },
    "FP8BwdTensors": {
        "GRAD_OUTPUT1": 0, "GRAD_INPUT1": 1, "GRAD_OUTPUT2": 2, "GRAD_INPUT2": 3, "GRAD_OUTPUT3": 4,
        "GRAD_INPUT3": 5,
    },
    "NVTE_Bias_Type": {"NVTE_NO_BIAS": 0, "NVTE_PRE_SCALE_BIAS": 1, "NVTE_POST_SCALE_BIAS": 2, "NVTE_ALIBI": 3},
    "NVTE_Mask_Type": {
        "NVTE_NO_MASK": 0, "NVTE_PADDING_MASK": 1, "NVTE_CAUSAL_MASK": 2, "NVTE_PADDING_CAUSAL_MASK": 3,
        "NVTE_CAUSAL_BOTTOM_RIGHT_MASK": 4, "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK": 5,
    },
    "NVTE_Softmax_Type": {"NVTE_VANILLA_SOFTMAX": 0, "NVTE_OFF_BY_ONE_SOFTMAX": 1, "NVTE_LEARNABLE_SOFTMAX": 2},
    "NVTE_QKV_Format": {
        "NVTE_SBHD": 0, "NVTE_BSHD": 1, "NVTE_THD": 2, "NVTE_BSHD_2SBHD": 3, "NVTE_SBHD_2BSHD": 4,
        "NVTE_THD_2BSHD": 5, "NVTE_THD_2SBHD": 6, "NVTE_BHSD": 7, "NVTE_QKV_Format_NOT_SET": 8,
    },
    "NVTE_QKV_Layout": {
        name: i
        for i, name in enumerate(
            "NVTE_SB3HD NVTE_SBH3D NVTE_SBHD_SB2HD NVTE_SBHD_SBH2D NVTE_SBHD_SBHD_SBHD NVTE_BS3HD NVTE_BSH3D "
            "NVTE_BSHD_BS2HD NVTE_BSHD_BSH2D NVTE_BSHD_BSHD_BSHD NVTE_T3HD NVTE_TH3D NVTE_THD_T2HD NVTE_THD_TH2D "
            "NVTE_THD_THD_THD NVTE_SBHD_BSHD_BSHD NVTE_BSHD_SBHD_SBHD NVTE_THD_BSHD_BSHD NVTE_THD_SBHD_SBHD "
            "NVTE_Paged_KV_BSHD_BSHD_BSHD NVTE_Paged_KV_BSHD_SBHD_SBHD NVTE_Paged_KV_SBHD_BSHD_BSHD "
            "NVTE_Paged_KV_SBHD_SBHD_SBHD NVTE_Paged_KV_THD_BSHD_BSHD NVTE_Paged_KV_THD_SBHD_SBHD "
            "NVTE_BHSD_BHSD_BHSD".split()
        )
    }
    | {"NVTE_QKV_Layout_NOT_SET": 100},
    "NVTE_Fused_Attn_Backend": {
        "NVTE_F16_max512_seqlen": 0, "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2, "NVTE_No_Backend": -1,
    },
    "Float8BlockScaleTensorFormat": {"GEMM_READY": 0, "COMPACT": 1, "INVALID": 2},
    "CommOverlapType": {"RS": 0, "AG": 1},
    "CommOverlapAlgo": {
        "BULK_OVERLAP_AG": 0, "BULK_OVERLAP_RS": 1, "SPLIT_PIPELINED_AG_P2P": 2, "SPLIT_PIPELINED_RS": 3,
        "SPLIT_PIPELINED_RS_P2P": 4, "ATOMIC_GEMM_RS": 5, "ATOMIC_GEMM_AG_P2P": 6, "ATOMIC_GEMM_RS_P2P": 7,
        "EXTERNAL_BULK_OVERLAP_AG": 8,
    },
    "NVTEScalingMode": {
        "NVTE_DELAYED_TENSOR_SCALING": 0, "NVTE_MXFP8_1D_SCALING": 1, "NVTE_BLOCK_SCALING_1D": 2,
        "NVTE_BLOCK_SCALING_2D": 3, "NVTE_NVFP4_1D_SCALING": 4, "NVTE_INVALID_SCALING": 100,
    },
    "NVTERoutingMapFormat": {"BYTEMAP": 0, "BITMAP_U8": 1},
    "NVTEQBHistogramMode": {"TWO_KERNEL": 0, "FUSED_ATOMIC": 1},
}  # fmt: skip


# Which releases bind an enum (first release) and a member (first release, first release without);
# read from each release tag's pybind_helper.h / pybind.cpp. NVTEScalingMode: TE 2.20's Python
# reads tex.NVTEScalingMode at import (attention/dot_product_attention/utils.py).
_ENUM_SINCE = {
    "NVTE_QKV_Format": (2, 4),
    "NVTE_Softmax_Type": (2, 8),
    "Float8BlockScaleTensorFormat": (2, 8),
    "NVTERoutingMapFormat": (2, 18),
    "NVTEQBHistogramMode": (2, 20),
    "NVTEScalingMode": (2, 20),
}
_MEMBER_RANGE = {
    ("CommOverlapAlgo", "EXTERNAL_BULK_OVERLAP_AG"): ((2, 8), None),
    ("Float8BlockScaleTensorFormat", "INVALID"): ((2, 12), None),
    ("NVTE_Fused_Attn_Backend", "NVTE_F16_max512_seqlen"): ((0,), (2, 16)),
    ("NVTE_QKV_Format", "NVTE_BHSD"): ((2, 15), None),
    ("NVTE_QKV_Format", "NVTE_QKV_Format_NOT_SET"): ((2, 15), None),
    ("NVTE_QKV_Layout", "NVTE_BHSD_BHSD_BHSD"): ((2, 15), None),
    # after the newest tag in the source mirror (main = 2.20.0.dev0); 2.20.2's Python reads it at
    # import for a dataclass default only, so its value is not one TE computes with
    ("NVTE_QKV_Layout", "NVTE_QKV_Layout_NOT_SET"): ((2, 20), None),
    **{
        ("NVTE_QKV_Layout", m): ((2, 4), None)
        for m in (
            "NVTE_SBHD_BSHD_BSHD NVTE_BSHD_SBHD_SBHD NVTE_THD_BSHD_BSHD NVTE_THD_SBHD_SBHD "
            "NVTE_Paged_KV_BSHD_BSHD_BSHD NVTE_Paged_KV_BSHD_SBHD_SBHD "
            "NVTE_Paged_KV_SBHD_BSHD_BSHD NVTE_Paged_KV_SBHD_SBHD_SBHD "
            "NVTE_Paged_KV_THD_BSHD_BSHD NVTE_Paged_KV_THD_SBHD_SBHD"
        ).split()
    },
}


def enums(release: tuple[int, ...]) -> dict[str, dict[str, int]]:
    """The extension's enums as `release` binds them: {enum: {member: value}}."""
    out = {}
    for name, members in _ENUMS.items():
        if release < _ENUM_SINCE.get(name, (0,)):
            continue
        kept = {}
        for member, value in members.items():
            since, until = _MEMBER_RANGE.get((name, member), ((0,), None))
            if release >= since and (until is None or release < until):
                kept[member] = value
        out[name] = kept
    return out


class MissingKernel(NotImplementedError, AttributeError):
    """TE asked the twin extension for something it does not implement."""


def _unavailable_class(name: str, why: str) -> type:
    """A class TE names in type hints and base classes (comm+GEMM overlap) that cannot be made here."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise MissingKernel(f"transformer_engine_torch.{name}: {why}")

    return type(name, (), {"__init__": __init__, "__module__": "transformer_engine_torch"})


# Kernels TE puts in dispatch tables at call time (so they must resolve) that the twin does not
# compute: calling one raises MissingKernel.
_TABLED = ("clamped_swiglu", "clamped_dswiglu")
_OVERLAP = "comm+GEMM overlap needs userbuffers on GPUs; the CPU twin has none"


class TwinExtension(types.ModuleType):
    """The module object TE imports as `transformer_engine_torch`."""

    missing: list[str]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self.__dict__.setdefault("missing", []).append(name)
        raise MissingKernel(
            f"transformer_engine_torch.{name} is not implemented by the CPU twin (harness/te_twin); "
            "TE called a kernel the twin does not have"
        )


def _absent(name: str, module: TwinExtension) -> Any:
    """What a name TE imports by name at module import (`from transformer_engine_torch import X`)
    but the twin lacks is bound to: a class that cannot be made (upper-case names: classes and
    enums in type hints), else a function that raises when called. Either records the use."""
    why = f"transformer_engine_torch.{name} is not implemented by the CPU twin (harness/te_twin)"
    if name[:1].isupper():
        return _unavailable_class(name, "not implemented by the CPU twin (harness/te_twin)")

    def absent(*args: Any, **kwargs: Any) -> Any:
        module.missing.append(name)
        raise MissingKernel(why + "; TE called a kernel the twin does not have")

    absent.__name__ = absent.__qualname__ = name
    return absent


def imported_by_name(folder: Path) -> set[str]:
    """Names a release's Python imports from the extension by name at module import: from
    `transformer_engine_torch` itself, or from `cpp_extensions` when its own files do not define
    them (they come from its `from transformer_engine_torch import *`)."""
    from_extension: set[str] = set()
    from_cpp: set[str] = set()
    defined: set[str] = set()
    root = folder / "transformer_engine"
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        in_cpp = "cpp_extensions" in path.parts
        if "transformer_engine_torch import" not in text and "cpp_extensions import" not in text and not in_cpp:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                names = {a.name for a in node.names if a.name != "*"}
                if target == "transformer_engine_torch":
                    from_extension |= names
                elif target.endswith("cpp_extensions"):
                    from_cpp |= names
            if in_cpp and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            if in_cpp and isinstance(node, ast.ImportFrom) and node.module != "transformer_engine_torch":
                defined.update(a.asname or a.name for a in node.names)
            if in_cpp and isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return from_extension | (from_cpp - defined)


@kernel("get_num_cublas_streams")
def get_num_cublas_streams() -> int:
    """nvte_get_num_compute_streams (common/util/multi_stream.cpp): 4."""
    return 4


def _no_fused_attention_backend(module: TwinExtension) -> Any:
    """nvte_get_fused_attn_backend (common/fused_attn/fused_attn.cpp): the fused attention backend
    cuDNN offers for the arguments; the twin has no fused attention, so NVTE_No_Backend, the answer
    TE's C++ gives when no backend fits (TE then runs its unfused PyTorch attention). From 2.20 it
    returns (backend, the reason it rejected the others) (2.20.2 dot_product_attention/utils.py)."""
    release = module.__twin_release__  # type: ignore[attr-defined]

    def get_fused_attn_backend(*args: Any, **kwargs: Any) -> Any:
        backend = module.NVTE_Fused_Attn_Backend.NVTE_No_Backend
        return (backend, "the CPU twin has no fused attention") if release >= (2, 20) else backend

    return get_fused_attn_backend


def build(release: tuple[int, ...], folder: Path) -> TwinExtension:
    """The twin extension for a TE release (its DType enum's members differ by release; `folder`
    is the release's wheel, whose by-name imports from the extension must resolve)."""
    module = TwinExtension("transformer_engine_torch", "CPU twin of TE's compiled extension (harness/te_twin)")
    module.missing = []
    module.__twin_release__ = release  # type: ignore[attr-defined]
    names: dict[str, Any] = {"DType": dtypes.make_enum(release)}
    for name, members in enums(release).items():
        names[name] = enum.IntEnum(name, members, module="transformer_engine_torch")  # type: ignore[misc]
    for name in (
        "CommOverlapCore",
        "CommOverlapBase",
        "CommOverlapP2PBase",
        "CommOverlap",
        "CommOverlapP2P",
        "CommOverlapHelper",
    ):
        names[name] = _unavailable_class(name, _OVERLAP)
    kernels: dict[str, Any] = {
        "quantize": cast.quantize,
        "dequantize": cast.dequantize,
        "create_empty_quantized_tensor": cast.create_empty_quantized_tensor,
        "fp8_transpose": cast.fp8_transpose,
        "bgrad_quantize": cast.bgrad_quantize,
        "split_quantize": cast.split_quantize,
        "fused_multi_quantize": cast.fused_multi_quantize,
        "compute_amax": cast.compute_amax,
        "generic_gemm": gemm.generic_gemm,
        "te_general_grouped_gemm": gemm.te_general_grouped_gemm,
        "layernorm_fwd": norms.layernorm_fwd,
        "layernorm_bwd": norms.layernorm_bwd,
        "rmsnorm_fwd": norms.rmsnorm_fwd,
        "rmsnorm_bwd": norms.rmsnorm_bwd,
        "fused_amax_and_scale_update_after_reduction": recipe.fused_amax_and_scale_update_after_reduction,
        "get_num_cublas_streams": get_num_cublas_streams,
        # device queries the extension answers (common/util): a CUDA 12.9 / cuBLASLt / cuDNN 9 build
        "get_cublasLt_version": lambda: 120900,
        "get_cudnn_version": lambda: 90800,
        "device_supports_multicast": lambda device_id=-1: False,
        "ubuf_built_with_mpi": lambda: False,
        "nvte_built_with_cublasmp": lambda: False,
        "get_stream_priority_range": lambda device_id=-1: (0, -1),
        **activations.KERNELS,
    }
    names.update(kernels)
    names["get_fused_attn_backend"] = _no_fused_attention_backend(module)
    if release < (2, 3):  # TE's Python swizzled MXFP8 scales itself before each GEMM
        from harness.te_twin import mxfp8

        names.update({"rowwise_swizzle": mxfp8.rowwise_swizzle, "columnwise_swizzle": mxfp8.columnwise_swizzle})
    if release < (2, 5):  # an attribute before 2.5 (pybind.cpp: m.attr("_num_cublas_streams"), gemm.h num_streams)
        del names["get_num_cublas_streams"]
        names["_num_cublas_streams"] = 4
    # read into TE's activation tables (module/layernorm_mlp.py) but not implemented: raise if called
    for name in sorted((imported_by_name(folder) | set(_TABLED)) - set(names)):
        names[name] = _absent(name, module)
    module.__dict__.update(names)
    module.__all__ = sorted(names)  # type: ignore[attr-defined]
    return module
