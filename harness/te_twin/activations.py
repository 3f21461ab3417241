"""The extension's activations and their gradients, with the quantization fused as TE fuses it.

Formulas: common/util/math.h (GELU is the tanh approximation); gated variants (GEGLU, SwiGLU,
ReGLU, ...) split the last dimension in two, act(first half) * second half (common/activation).
Fusion (csrc/extensions/activation.cpp, bias.cpp; main and v2.9): without a quantizer the result is
in the input's type; a delayed-scaling (or MXFP8) quantizer casts the float32 result directly
(one fused kernel); a current-scaling quantizer quantizes the result rounded to the input's type
(amax of that). `dbias_d*` also return the bias gradient: the row sum of the activation gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.te_twin import storage
from harness.te_twin.counters import kernel


def gelu_f32(x: torch.Tensor) -> torch.Tensor:
    return x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * x * x)))


def dgelu_f32(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def _dsigmoid(x: torch.Tensor) -> torch.Tensor:
    s = _sigmoid(x)
    return s * (1.0 - s)


_ACT: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "gelu": (gelu_f32, dgelu_f32),
    "relu": (lambda x: torch.clamp_min(x, 0.0), lambda x: (x > 0).float()),
    "silu": (lambda x: x * _sigmoid(x), lambda x: x * _dsigmoid(x) + _sigmoid(x)),
    "qgelu": (lambda x: x * _sigmoid(1.702 * x), lambda x: 1.702 * x * _dsigmoid(1.702 * x) + _sigmoid(1.702 * x)),
    "srelu": (lambda x: torch.clamp_min(x, 0.0) ** 2, lambda x: 2.0 * torch.clamp_min(x, 0.0)),
    "sigmoid": (_sigmoid, _dsigmoid),
}
_GATED = {"glu": "sigmoid", "geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu", "sreglu": "srelu"}


def _emit(values: torch.Tensor, like: torch.dtype, quantizer: Any) -> Any:
    """The output as the kernel writes it (see the module docstring)."""
    from harness.te_twin import cast

    kind = storage.quantizer_kind(quantizer)
    if kind is None:
        return storage.output(values, like)
    source = values if kind in ("delayed", "mxfp8") else storage.output(values, like)  # unfused: a temporary
    out = cast.create(quantizer, list(values.shape), like)
    return cast.quantize_into(source, quantizer, out)


def _forward(name: str) -> Callable[..., Any]:
    gated = name in _GATED
    act = _ACT[_GATED.get(name, name)][0]

    def run(input: torch.Tensor, quantizer: Any) -> Any:
        x = input.contiguous().float()
        if gated:
            a, lin = x.chunk(2, dim=-1)
            values = act(a) * lin
        else:
            values = act(x)
        return _emit(values, input.dtype, quantizer)

    run.__doc__ = f"tex.{name}(input, quantizer) (activation.cpp)"
    return kernel(name)(run)


def _backward(name: str) -> Callable[..., Any]:
    base = _GATED.get(name, name)
    act, dact = _ACT[base]
    gated = name in _GATED

    def values_of(grad: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        g, x = grad.contiguous().float(), input.contiguous().float()
        if gated:
            a, lin = x.chunk(2, dim=-1)
            return torch.cat([g * lin * dact(a), g * act(a)], dim=-1)
        return g * dact(x)

    def run(grad: torch.Tensor, input: torch.Tensor, quantizer: Any) -> Any:
        return _emit(values_of(grad, input), grad.dtype, quantizer)

    run.__doc__ = f"tex.d{name}(grad, input, quantizer) (activation.cpp)"
    run.values_of = values_of  # type: ignore[attr-defined]
    return kernel("d" + name)(run)


def _dbias(name: str, backward: Any) -> Callable[..., Any]:
    def run(grad_output: torch.Tensor, act_input: torch.Tensor, quantizer: Any) -> list[Any]:
        values = backward.__wrapped__.values_of(grad_output, act_input)
        kind = storage.quantizer_kind(quantizer)
        fused = kind in ("delayed", "mxfp8")
        summed = values if fused else values.to(grad_output.dtype).float()
        dbias = storage.output(storage.to_2d(summed).sum(0), grad_output.dtype)
        return [dbias, _emit(values, grad_output.dtype, quantizer)]

    run.__doc__ = f"tex.dbias_d{name}(grad_output, act_input, quantizer) -> [dbias, dact] (bias.cpp)"
    return kernel("dbias_d" + name)(run)


_NAMES = [n for n in _ACT if n != "sigmoid"] + list(_GATED)  # the extension has no plain sigmoid
FORWARD = {name: _forward(name) for name in _NAMES}
BACKWARD = {"d" + name: _backward(name) for name in _NAMES}
DBIAS = {"dbias_d" + name: _dbias(name, BACKWARD["d" + name]) for name in _ACT if name != "sigmoid"}
KERNELS: dict[str, Callable[..., Any]] = {**FORWARD, **BACKWARD, **DBIAS}
