"""A test's node id as pytest knows it without pytest-xdist: under `--dist loadgroup` the worker
appends `@group` to the id of each test marked `xdist_group`, and a child pytest (which runs the test
alone, without xdist) selects and reports it by the id without that suffix."""

from __future__ import annotations

import pytest


def group(item: pytest.Item) -> str | None:
    """The xdist group of `item` as xdist 3.8 names it (its marks' names, sorted, joined by `_`)."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


def plain(item: pytest.Item) -> str:
    """`item.nodeid` less the `@group` suffix xdist's loadgroup adds (nothing else removed)."""
    name = group(item)
    return item.nodeid if name is None else item.nodeid.removesuffix(f"@{name}")
