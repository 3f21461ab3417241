"""A second plain module with an offload function, for the smoke test of a fork during the first load."""

from __future__ import annotations


def offload(models: object, *, tag: str = "") -> tuple[object, str]:
    """Stands for a framework's offload: returns what it was given, so the test sees it got through."""
    return models, tag
