"""Stands in for the allocator flush (`torch.cuda.empty_cache()`, `clear_memory()`) and
`torch_memory_saver.pause()` in the framework mirrors: records what is still cached at that moment,
which is what decides whether the memory goes back to the driver: the caches must be gone by then."""

from __future__ import annotations

from typing import Any

from harness.megatron_world import cache_state

EVENTS: list[tuple[str, int]] = []


def _chunks(models: Any) -> list[Any]:
    return list(models) if isinstance(models, (list, tuple)) else [models]


def empty_cache(models: Any) -> None:
    EVENTS.append(("flush", cache_state(_chunks(models))["entries"]))


def pause(models: Any) -> None:
    EVENTS.append(("pause", cache_state(_chunks(models))["entries"]))
