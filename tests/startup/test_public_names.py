"""`dir(te_offload_shim)` shows what a user may rely on: the names of `__all__` (the ones docs/api.md
describes) and the module's own dunder attributes; not the start-up's tables, its type-checking
switch or the modules it imported. Only the listing changes: every attribute stays reachable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.mark.subprocess(fresh=True)
def test_dir_lists_the_public_names_and_the_dunders_only() -> None:
    import te_offload_shim

    public = [name for name in dir(te_offload_shim) if not name.startswith("__")]
    assert public == sorted(te_offload_shim.__all__)
    assert {"__version__", "__file__", "__path__", "__all__"} <= set(dir(te_offload_shim))
    te_offload_shim.status()  # loads the lazy names into the namespace: still not listed beyond __all__
    assert [name for name in dir(te_offload_shim) if not name.startswith("__")] == sorted(te_offload_shim.__all__)


def test_the_internal_names_stay_reachable() -> None:
    import te_offload_shim

    for name in ("BUILTIN_MODULES", "WATCH", "PATCH_TARGETS", "EXPORTS", "HOOK", "TYPE_CHECKING", "os"):
        assert hasattr(te_offload_shim, name), name


def test_every_public_name_is_documented_and_all_targets_is_not_exported() -> None:
    import te_offload_shim

    text = API_PAGE.read_text()
    undocumented = [n for n in te_offload_shim.__all__ if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert undocumented == [], "each name of __all__ appears in docs/api.md"
    assert "all_targets" not in te_offload_shim.EXPORTS, "the engine's Target is no public type"
    with pytest.raises(AttributeError):
        te_offload_shim.all_targets  # noqa: B018
