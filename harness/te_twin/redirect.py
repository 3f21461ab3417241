"""TE's "cuda" allocations and copies, served by the CPU.

TE allocates on `device="cuda"` (or `torch.cuda.current_device()`, an int), moves tensors with
`.cuda()` / `.to("cuda")` and pins host buffers. On the twin the one device's memory is the CPU's,
so a `TorchFunctionMode` rewrites those device arguments to the CPU and drops `pin_memory=True`.
A consequence to keep in mind: host and device are the same memory, so `.cuda()` / `.to("cuda")`
of a tensor returns that tensor (as torch does for a tensor already on the device), not a copy
(a tensor an offload moved to the host excepted: host.py);
`Tensor.pin_memory()` does return a copy, as real pinning does (an offload that pins a host copy
and then frees the device storage keeps its data).

Two places a mode does not reach, handled here:
- autograd runs a custom Function's `backward` outside the torch-function mode stack the forward
  ran in, so `BackwardCFunction.apply` (what the engine calls for every `torch.autograd.Function`)
  re-enters the mode around it;
- `Tensor._make_wrapper_subclass` (how TE's `QuantizedTensor.__new__` makes its wrapper) is not
  dispatched through torch functions: it is wrapped to take the CPU as well.

The mode also counts what the twin's step-cost benchmark reports: the bytes of the device
allocations made through it (counters.py says which).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from harness.te_twin import counters, host

_CPU = torch.device("cpu")
_TO = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.pin_memory}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare device index means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _cpu_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    if "device" in kwargs and _is_cuda(kwargs["device"]):
        kwargs = {**kwargs, "device": _CPU}
    if kwargs.get("pin_memory"):
        kwargs = {**kwargs, "pin_memory": False}
    return kwargs


class ToCPU(TorchFunctionMode):
    """Every torch call that names the CUDA device gets the CPU instead; while an offload runs under
    `host.offloading()`, or a tensor it moved to the host lives, host.py answers for the host."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not host.watching():
            return _answer(func, args, kwargs)
        out = host.moved(func, args, kwargs, _answer, _is_cuda)
        if out is host.PASS:
            out = _answer(func, args, kwargs)
            if host.scoped():
                host.made(func, args, kwargs, out, "device" in kwargs and _is_cuda(kwargs["device"]))
        return out


def _answer(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The call on the CPU, the CUDA device named in it replaced."""
    on_device = "device" in kwargs and _is_cuda(kwargs["device"])
    if func in _TO:
        if func is torch.Tensor.pin_memory:  # pinning allocates a new host buffer: a copy, never self
            return args[0].clone()
        if func is torch.Tensor.cuda:
            return args[0]
        args = tuple(_CPU if _is_cuda(a) else a for a in args)
        kwargs = _cpu_device(kwargs)
        if len(args) == 1 and not kwargs:  # `.to("cuda")` with nothing else: already there
            return args[0]
    elif kwargs:
        kwargs = _cpu_device(kwargs)
    out = func(*args, **kwargs)
    if counters.active and type(out) is torch.Tensor:
        name = getattr(func, "__name__", "")
        if name in _FACTORIES and (on_device or (name.endswith("_like") and counters.depth == 0)):
            counters.allocated(out)
    return out


# torch functions that allocate a new tensor (counted by the step-cost benchmark)
_FACTORIES = frozenset(
    {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "empty_strided"}
)

MODE = ToCPU()
_installed = False


def _reentering(apply: Any) -> Any:
    @functools.wraps(apply)
    def run(self: Any, *args: Any) -> Any:
        with MODE:
            return apply(self, *args)

    return run


def _wrapper_subclass(make: Any) -> Any:
    @functools.wraps(make)
    def run(cls: Any, *args: Any, **kwargs: Any) -> Any:
        return make(cls, *args, **_cpu_device(kwargs))

    return staticmethod(run)


def install() -> None:
    """Enter the mode for the rest of the process, and make autograd and wrapper subclasses use it."""
    global _installed
    if _installed:
        return
    from torch.autograd.function import BackwardCFunction

    BackwardCFunction.apply = _reentering(BackwardCFunction.apply)  # type: ignore[method-assign]
    torch.Tensor._make_wrapper_subclass = _wrapper_subclass(torch.Tensor._make_wrapper_subclass)  # type: ignore[method-assign]
    MODE.__enter__()
    _installed = True
