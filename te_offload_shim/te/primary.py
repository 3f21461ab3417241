"""FP8 primary weights (`fp8_model_init` / megatron `fp8_param`): TE creates no workspace for them,
but the parameter itself carries a transpose / columnwise copy outside the DDP buffer (Float8Tensor
`_transpose`; MXFP8, blockwise, NVFP4 `_columnwise_*`), which an offload leaves on the GPU. Counted
in the clearing's report; Float8Tensor transposes are also dropped where TE rebuilds them, through
TE's own API for it where the release has one (`_drop_transpose`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from te_offload_shim._log import describe_error, fail_open
from te_offload_shim.te import sizes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from te_offload_shim.te.report import CacheReport

# The fields of a quantized parameter that hold its second-direction copy, by class family
# (transformer_engine/pytorch/tensor/...: Float8Tensor 2.x; MXFP8, Float8Blockwise, NVFP4).
PRIMARY_WEIGHT_COPIES = ("_transpose", "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")
_WHERE_MAX = 16


# TE releases whose modules rebuild a dropped Float8Tensor transpose when it is next needed: from
# 2.4, Linear, LayerNormLinear, LayerNormMLP and GroupedLinear call
# `weight.update_usage(columnwise_usage=True)` on an FP8 weight in backward, which recreates the
# transpose (`_create_transpose`) when it is missing (module/*.py; checked per release by
# tests/te/test_te_real.py). MXFP8 / blockwise / NVFP4 columnwise data is quantized from the
# high-precision weight, which a primary weight no longer has: never dropped.
TRANSPOSE_REBUILT_FROM = (2, 4)
# TE's functions that drop a quantized tensor's column-wise copy, best first: `clear_columnwise_cache`
# (tensor/utils.py, 2.16+, TE #2805; it would drop MXFP8 columnwise data too, so it is called only on
# a weight whose one copy is a Float8Tensor `_transpose`), `Float8Tensor.remove_caches()` (2.1+,
# TE #1425), then `update_usage(columnwise_usage=False)`, which every 2.x release has. Each leaves
# `_transpose` None and marks it invalid, so TE's backward re-creates it.
TE_TENSOR_UTILS = "transformer_engine.pytorch.tensor.utils"


def _te_release() -> tuple[int, ...]:
    te = sys.modules.get("transformer_engine")
    try:
        return tuple(int(p) for p in str(getattr(te, "__version__", "0")).split(".")[:2])
    except ValueError:
        return (0,)


def primary_weight_copies(
    index: int,
    modules: Iterable[tuple[Any, dict]],
    torch: Any,
    report: CacheReport,
    clear: bool = False,
) -> None:
    """Count the transpose / columnwise copies that FP8 primary weights of these TE layers carry;
    when clearing (the caller decides: never under CUDA graphs), drop Float8Tensor transposes
    through TE's own API where TE rebuilds them (TRANSPOSE_REBUILT_FROM)."""
    usual = {torch.Tensor, torch.nn.Parameter, type(None)}
    may_drop = clear and _te_release() >= TRANSPOSE_REBUILT_FROM
    for module, d in modules:
        params = d.get("_parameters")
        if not params or usual.issuperset(map(type, params.values())):  # the common case, in C
            continue
        for name, param in params.items():
            if type(param) in usual:  # a plain one, or None
                continue
            try:
                copies = [getattr(param, f, None) for f in PRIMARY_WEIGHT_COPIES]
                held = sizes.storages([c for c in copies if c is not None], torch)
            except Exception:  # a parameter class we do not know: nothing to say about it
                continue
            if not held:
                continue
            report.primary_weight_params += 1
            fields = "/".join(f for f, c in zip(PRIMARY_WEIGHT_COPIES, copies, strict=True) if c is not None)
            if fields == "_transpose" and may_drop and _drop_transpose(param, report):
                report.primary_weight_cleared += sum(held.values())
                continue
            report.primary_weight_bytes += sum(held.values())
            if len(report.primary_weight_where) < _WHERE_MAX:
                report.primary_weight_where.append(
                    f"chunk{index}:{type(module).__name__}.{name} ({type(param).__name__}.{fields})"
                )


def _drop_transpose(param: Any, report: CacheReport) -> bool:
    """Drop `param`'s transpose with the best of TE's functions its release has (TE_TENSOR_UTILS)."""
    try:
        utils = sys.modules.get(TE_TENSOR_UTILS)  # never imported here: loaded with TE's tensor classes
        clear_columnwise = getattr(utils, "clear_columnwise_cache", None)
        if callable(clear_columnwise):
            clear_columnwise(param)
            how = "clear_columnwise_cache"
        elif callable(getattr(type(param), "remove_caches", None)):
            param.remove_caches()
            how = "remove_caches"
        else:
            param.update_usage(columnwise_usage=False)
            how = "update_usage"
        if getattr(param, "_transpose", None) is not None:
            return False
        report.primary_weight_dropped_by = how
        return True
    except Exception as exc:  # the fail-open rule without strict mode: the call's entry raises ShimError then
        key = f"transpose:{type(exc).__name__}"
        fail_open(exc, key, "te_offload_shim: cannot drop an FP8 weight's transpose: %s", exc, strict=False)
        report.errors.append(f"dropping a Float8Tensor transpose: {describe_error(exc)}")
        return False
