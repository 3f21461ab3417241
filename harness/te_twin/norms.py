"""The extension's LayerNorm and RMSNorm, forward (with the output quantized as TE fuses it) and
backward.

Sources: csrc/extensions/normalization.cpp (main = 2.20.0.dev0, v2.9): forward returns
[out, mu, rsigma] (mu None for RMSNorm), mu / rsigma in float32 over the flattened rows;
`zero_centered_gamma` uses (1 + gamma). A delayed-scaling quantizer is fused into the norm
kernel (FP8 written from the float32 result); any other quantizer quantizes the result in the
output type. A given `out` is written in place. Backward returns [dx, dgamma, dbeta] (RMSNorm:
[dx, dgamma]); the parameter gradients are row sums in float32, cast to gamma's type.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes, storage
from harness.te_twin.counters import kernel

_FWD_ARGS = ("input", "weight", "bias", "eps", "ln_out", "quantizer", "otype", "sm_margin", "zero_centered_gamma")
_RMS_FWD_ARGS = ("input", "weight", "eps", "ln_out", "quantizer", "otype", "sm_margin", "zero_centered_gamma")


def _gamma(weight: torch.Tensor, zero_centered: bool) -> torch.Tensor:
    g = weight.float()
    return g + 1.0 if zero_centered else g


def _emit(values: torch.Tensor, out: Any, quantizer: Any, otype: torch.dtype) -> Any:
    from harness.te_twin import cast

    kind = storage.quantizer_kind(quantizer)
    source = values if kind == "delayed" else storage.output(values, otype)  # unfused: a temporary
    if kind is None:
        if out is None:
            return storage.output(source)
        out.copy_(source.reshape(out.shape))
        return out
    if out is None:
        out = cast.create(quantizer, list(values.shape), otype)
    return cast.quantize_into(source, quantizer, out)


def _bind(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


@kernel("layernorm_fwd")
def layernorm_fwd(*args: Any, **kwargs: Any) -> list[Any]:
    """tex.layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin,
    zero_centered_gamma) -> [ln_out, mu, rsigma]."""
    a = _bind(_FWD_ARGS, args, kwargs)
    x = a["input"].contiguous()
    rows = storage.to_2d(x).float()
    mu = rows.mean(dim=1)
    var = ((rows - mu[:, None]) ** 2).mean(dim=1)
    rsigma = torch.rsqrt(var + float(a["eps"]))
    values = (rows - mu[:, None]) * rsigma[:, None] * _gamma(a["weight"], bool(a["zero_centered_gamma"]))
    if a.get("bias") is not None:
        values = values + a["bias"].float()
    otype = dtypes.to_torch(a["otype"])
    out = _emit(values.reshape(x.shape), a.get("ln_out"), a.get("quantizer"), otype)
    return [out, storage.output(mu), storage.output(rsigma)]


@kernel("rmsnorm_fwd")
def rmsnorm_fwd(*args: Any, **kwargs: Any) -> list[Any]:
    """tex.rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma)
    -> [ln_out, None, rsigma]."""
    a = _bind(_RMS_FWD_ARGS, args, kwargs)
    x = a["input"].contiguous()
    rows = storage.to_2d(x).float()
    rsigma = torch.rsqrt((rows * rows).mean(dim=1) + float(a["eps"]))
    values = rows * rsigma[:, None] * _gamma(a["weight"], bool(a["zero_centered_gamma"]))
    otype = dtypes.to_torch(a["otype"])
    out = _emit(values.reshape(x.shape), a.get("ln_out"), a.get("quantizer"), otype)
    return [out, None, storage.output(rsigma)]


@kernel("layernorm_bwd")
def layernorm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    sm_margin: int = 0,
    zero_centered_gamma: bool = False,
) -> list[torch.Tensor]:
    """tex.layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma) -> [dx, dgamma, dbeta]."""
    g = storage.to_2d(dz.contiguous()).float()
    rows = storage.to_2d(x.contiguous()).float()
    xhat = (rows - mu.float()[:, None]) * rsigma.float()[:, None]
    w = _gamma(gamma, zero_centered_gamma)
    dy = g * w
    n = rows.shape[1]
    dx = rsigma.float()[:, None] * (dy - dy.mean(dim=1, keepdim=True) - xhat * (dy * xhat).sum(dim=1, keepdim=True) / n)
    dgamma = (g * xhat).sum(0)
    dbeta = g.sum(0)
    return [
        storage.output(dx.reshape(x.shape), x.dtype),
        storage.output(dgamma, gamma.dtype),
        storage.output(dbeta, gamma.dtype),
    ]


@kernel("rmsnorm_bwd")
def rmsnorm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    sm_margin: int = 0,
    zero_centered_gamma: bool = False,
) -> list[torch.Tensor]:
    """tex.rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma) -> [dx, dgamma]."""
    g = storage.to_2d(dz.contiguous()).float()
    rows = storage.to_2d(x.contiguous()).float()
    r = rsigma.float()[:, None]
    xhat = rows * r
    dy = g * _gamma(gamma, zero_centered_gamma)
    n = rows.shape[1]
    dx = r * (dy - xhat * (dy * xhat).sum(dim=1, keepdim=True) / n)
    dgamma = (g * xhat).sum(0)
    return [storage.output(dx.reshape(x.shape), x.dtype), storage.output(dgamma, gamma.dtype)]
