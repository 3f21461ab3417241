"""An application's memory tracker that wrapped torch's allocator flush before TE was imported, in
the three ways such a wrapper holds the function it wraps: a module global (`_saved`), a closure,
or torch's module attribute read at every call (`torch.cuda.memory.empty_cache`). Each counts its
calls in `calls`. Imported inside a fresh interpreter, after the twin's device is in place."""

from __future__ import annotations

from typing import Any

import torch

calls: list[str] = []
_saved: Any = None


def install(shape: str) -> Any:
    """Put the tracker of `shape` ("global", "closure", "attribute") in `torch.cuda.empty_cache`'s
    place, wrapping torch's own `torch.cuda.memory.empty_cache`; returns it."""
    global _saved
    torch_flush = torch.cuda.memory.empty_cache
    if shape == "global":
        _saved = torch_flush
        tracked = _tracked_global
    elif shape == "closure":

        def tracked() -> Any:
            calls.append("closure")
            return torch_flush()

    else:

        def tracked() -> Any:
            calls.append("attribute")
            return torch.cuda.memory.empty_cache()

    torch.cuda.empty_cache = tracked  # type: ignore[assignment]
    return tracked


def _tracked_global() -> Any:
    calls.append("global")
    return _saved()
