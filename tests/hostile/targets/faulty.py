"""A module whose attributes defeat the patcher in every way we can think of (tests/engine/test_faults.py)."""

from __future__ import annotations

CONST = 42


class _NoSignature:
    @property
    def __signature__(self) -> object:
        raise RuntimeError("no signature for you")

    def __call__(self, models: object) -> str:
        return "called"


weird = _NoSignature()


def fine(models: object) -> str:
    return "fine"


def other(models: object) -> str:
    return "other"


class Engine:
    @property
    def model(self) -> object:
        raise RuntimeError("model property exploded")

    def offload(self) -> str:
        return "offloaded"
