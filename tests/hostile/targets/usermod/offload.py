"""Offload functions of a user's own trainer (tests/engine/test_user_targets.py, TE_OFFLOAD_SHIM_TARGETS):
each records what is cached at its own flush."""

from __future__ import annotations

from typing import Any

from harness.megatron_world import cache_state

FLUSHES: list[tuple[str, int]] = []


def offload(models: Any) -> None:
    FLUSHES.append(("offload", cache_state(models)["entries"]))


def offload_pair(tag: str, models: Any) -> None:
    FLUSHES.append((tag, cache_state(models)["entries"]))


def offload_holder(models: Any) -> None:
    FLUSHES.append(("holder", cache_state(models.chunks)["entries"]))


class Holder:
    def __init__(self, chunks: Any) -> None:
        self.chunks = chunks


class Engine:
    def __init__(self, models: Any) -> None:
        self.model = models

    def offload(self) -> None:
        FLUSHES.append(("engine", cache_state(self.model)["entries"]))

    def offload_arg(self, tag: str, models: Any) -> None:
        FLUSHES.append((tag, cache_state(models)["entries"]))


class Virtual:
    def __init__(self, models: Any) -> None:
        self.models = models

    def get_models(self) -> Any:
        return self.models


class Strategy:
    def __init__(self, models: Any) -> None:
        self.model = Virtual(models)

    def offload_states(self, include: Any = None) -> None:
        FLUSHES.append(("strategy", cache_state(self.model.get_models())["entries"]))
