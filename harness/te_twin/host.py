"""The tensors an offload moved to the host: they answer as host tensors do on a GPU (`is_cuda` False).

On the twin the device's memory is the CPU's: every CPU tensor answers `is_cuda` True (device.py)
and `.to("cpu")` of one returns that tensor. The most common offload in the field moves each weight
to the host (`param.data = param.data.to("cpu")`: verl's reference chunks, ROLL; `param.data =
torch.empty(0, device="cpu")`: AReaL; `p.data = torch.Tensor()`: ChatLearn's trainer): on a GPU
those parameters are off the device type, and on the twin, without this module, they would read as
still on it (or as an empty tensor on it, which the flush net keeps as a reshard).

The twin cannot tell from a CPU tensor where it would be on a GPU; it can tell from the call that
made it. Inside `offloading()` (a test runs an offload's real code under it) what that code puts on
the host is a host tensor:
- a factory given `device="cpu"` or no device (torch's default device, the CPU): `torch.empty`,
  `zeros`, `tensor`, ...; a `*_like` given the CPU (without a device: its source's place); the
  legacy constructor `torch.Tensor(...)` (which torch does not hand to a torch-function mode, so it
  is wrapped for the scope's duration);
- `.to("cpu")`, `.cpu()`: a host copy, as a GPU copies device to host (the twin's own answer, the
  tensor itself, would put the source on the host too).
Everywhere, in the scope or not:
- `t.data = x`: `t` is where `x` is (a reload `param.data = cpu_copy.to("cuda")` brings it back);
- `.data`, `.detach()` and `pin_memory()` of a host tensor are host tensors;
- `.to("cuda")`, `.cuda()` of a host tensor: a device copy, never the host tensor itself.
Not followed: views of a host tensor and the results of ops on it (the twin's device, as before).

Kept by `id`, each dropped by its weak reference's callback: ids are reused after collection, and a
stale one would make TE's `prepare_forward` see a new layer's input as a CPU tensor and refuse it.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

_HOST: dict[int, weakref.ref[Any]] = {}
_depth = 0  # offloading() scopes open
PASS = object()  # `moved`'s answer for a call it leaves to the twin's usual path

# factories whose result is on the default device (the CPU) unless a device is named
FACTORIES = frozenset(
    {"empty", "zeros", "ones", "full", "empty_strided", "tensor", "rand", "randn", "randint", "arange"}
)
_DATA: Any = vars(torch._C.TensorBase)["data"]  # the getset descriptor a mode sees as `__get__` / `__set__`
_SET, _GET = _DATA.__set__, _DATA.__get__
_MOVES = {
    torch.Tensor.to: "to",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.cuda: "cuda",
    torch.Tensor.pin_memory: "pin",
    torch.Tensor.detach: "alias",
    _GET: "alias",
    _SET: "set",
}


def is_host(tensor: Any) -> bool:
    """Whether `tensor` (this very object) was moved to the host."""
    ref = _HOST.get(id(tensor))
    return ref is not None and ref() is tensor


def mark(tensor: Any, host: bool = True) -> None:
    """Record `tensor` as a host tensor (`host=False`: as the device's again)."""
    key = id(tensor)
    if not host:
        _HOST.pop(key, None)
    elif not is_host(tensor):
        _HOST[key] = weakref.ref(tensor, functools.partial(_drop, key))


def _drop(key: int, ref: weakref.ref[Any]) -> None:
    if _HOST.get(key) is ref:  # not a newer tensor's entry under a reused id
        del _HOST[key]


def watching() -> bool:
    """Whether a call can concern the host: an offload's scope is open, or a host tensor lives."""
    return bool(_depth or _HOST)


def scoped() -> bool:
    return _depth > 0


@contextlib.contextmanager
def offloading() -> Iterator[None]:
    """Run an offload: what its code moves to the host answers as a host tensor (above)."""
    global _depth
    if _depth == 0:
        torch.Tensor.__new__ = staticmethod(_legacy)  # type: ignore[assignment,method-assign]
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            del torch.Tensor.__new__


def _legacy(cls: type, *args: Any, **kwargs: Any) -> Any:
    """`torch.Tensor(...)` inside the scope: on the default device, the CPU, unless a device is named."""
    out: Any = torch._C.TensorBase.__new__(cls, *args, **kwargs)
    if kwargs.get("device") is None or torch.device(kwargs["device"]).type == "cpu":
        mark(out)
    return out


def _destination(args: tuple, kwargs: dict[str, Any], is_cuda: Callable[[Any], bool]) -> str | None:
    """Where `Tensor.to(*args, **kwargs)` goes: "host", "device", or None (no device named)."""
    device = kwargs.get("device")
    for arg in args[1:]:
        if isinstance(arg, torch.Tensor):
            return "host" if is_host(arg) else "device"
        if isinstance(arg, (str, torch.device)) or (isinstance(arg, int) and not isinstance(arg, bool)):
            device = arg
    if device is None:
        return None
    return "device" if is_cuda(device) else "host"


def moved(
    func: Any, args: tuple, kwargs: dict[str, Any], run: Callable[..., Any], is_cuda: Callable[[Any], bool]
) -> Any:
    """The answer to a call that moves a tensor or its data, or PASS for any other call. `run(func,
    args, kwargs)` is the twin's usual answer; `is_cuda(device)` whether a device argument names CUDA."""
    kind = _MOVES.get(func)
    if kind is None:
        return PASS
    src = args[0]
    if kind == "set":
        out = run(func, args, kwargs)
        mark(src, is_host(args[1]))
        return out
    out = run(func, args, kwargs)
    if kind == "alias":
        if is_host(src):
            mark(out)
        return out
    if kind == "pin":  # pinning makes a host buffer (the twin's answer is a copy already)
        if _depth or is_host(src):
            mark(out)
        return out
    where = {"cpu": "host", "cuda": "device"}.get(kind) or _destination(args, kwargs, is_cuda)
    if where == "device":
        return src.clone() if out is src and is_host(src) else out
    if where == "host" and (_depth or is_host(src)):
        if out is src and not is_host(src):
            out = src.clone()
        mark(out)
    return out


def made(func: Any, args: tuple, kwargs: dict[str, Any], out: Any, on_device: bool) -> None:
    """Inside the scope: mark what a factory put on the host (above)."""
    if on_device or not isinstance(out, torch.Tensor):
        return
    name = getattr(func, "__name__", "")
    if name in FACTORIES:
        mark(out)
    elif name.endswith("_like"):
        named = kwargs.get("device") is not None
        if named or (args and is_host(args[0])):
            mark(out)
