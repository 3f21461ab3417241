"""A reloader that reloads every module of the package, not only the package itself, keeps every
patch and `uninstall()`'s undoing; the counters start afresh (docs/guarantees.md, "What a reload
keeps")."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_util import cached_layer, write_module


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "deeply_reloaded:offload"})
def test_reloading_every_module_of_the_package_keeps_the_patches(tmp_path: Path) -> None:
    """A reloader that reloads every module of the package (not only the package itself): the
    registry forgot every patch (uninstall() restored nothing), the wrapper class changed, so status
    saw no wrapper, and a reloaded target was patched by a wrapper no later check recognised."""
    import importlib
    import sys

    import te_offload_shim as shim

    write_module(tmp_path, "deeply_reloaded", "def offload(models):\n    return 'offloaded'\n")
    import deeply_reloaded  # type: ignore[import-not-found]

    layer = cached_layer()
    deeply_reloaded.offload([layer])
    for name in sorted(n for n in sys.modules if n == "te_offload_shim" or n.startswith("te_offload_shim.")):
        module = sys.modules.get(name)  # the package's reload builds its hook's second half anew
        if module is not None:
            importlib.reload(module)

    def row() -> tuple[str, int]:
        found = next(r for r in shim.status()["targets"] if r["name"] == "deeply_reloaded:offload")
        return found["state"], found["layers"]

    assert row() == ("patched", 1)
    assert shim.stats()["calls"] == 0, "the counters start afresh: no reload keeps a count"
    importlib.reload(deeply_reloaded)
    assert row() == ("patched", 1), "one wrapper on the reloaded target, recognised as ours"
    layer = cached_layer()
    deeply_reloaded.offload([layer])
    assert layer._fp8_workspaces == {}
    assert (shim.stats()["calls"], shim.stats()["entries"]) == (1, 1), "counted by the counters made anew"
    assert shim.uninstall() == 1
    assert type(deeply_reloaded.offload).__name__ == "function", "the original is back"
    assert row() == ("not installed", 0)
