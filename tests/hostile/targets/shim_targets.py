"""Offload functions of every binding kind, for `TE_OFFLOAD_SHIM_TARGETS` in the hostile tests.

Each records what it received, so a test can tell that the original ran, with what.
"""

from __future__ import annotations

from typing import Any

CALLS: list[tuple[str, Any]] = []


def offload(models: Any) -> str:
    CALLS.append(("offload", models))
    return "offloaded"


class Engine:
    def __init__(self, models: Any = None) -> None:
        self.models = models

    def offload(self, models: Any) -> str:
        CALLS.append(("method", models))
        return "method"

    @staticmethod
    def static_offload(models: Any, tag: str = "static") -> str:
        CALLS.append((tag, models))
        return tag

    @classmethod
    def class_offload(cls, models: Any, tag: str = "class") -> str:
        CALLS.append((tag, models))
        return f"{cls.__name__}:{tag}"
