"""A plain module with an offload function, named in `TE_OFFLOAD_SHIM_TARGETS` by the smoke tests."""

from __future__ import annotations


def offload(models: object, *, tag: str = "") -> tuple[object, str]:
    """Stands for a framework's offload: returns what it was given, so the test sees it got through."""
    return models, tag
