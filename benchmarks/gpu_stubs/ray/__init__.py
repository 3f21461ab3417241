"""A stand-in for `ray` on the GPU machine of benchmarks/gpu_memory.py only (the real wheel is too big
to carry): verl imports ray at module top but its offload never calls it. Any attribute is a dummy."""

from __future__ import annotations

from typing import Any


class _Dummy:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Dummy()

    def __getattr__(self, name: str) -> Any:
        return _Dummy()

    def __getitem__(self, item: Any) -> Any:
        return _Dummy

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def __getattr__(name: str) -> Any:
    return _Dummy() if not name[:1].isupper() else type(name, (), {"__class_getitem__": classmethod(lambda c, i: c)})
