"""`status()` leaves a lazily loaded target module unloaded until the application's own first use."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_util import load_lazily, write_module


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "lazy_target:offload,eager_target:offload"})
def test_status_leaves_a_lazily_loaded_target_module_unloaded(tmp_path: Path) -> None:
    """status() counted our wrappers with vars(module), which runs a LazyLoader module's body."""
    import builtins

    import te_offload_shim as shim

    write_module(tmp_path, "eager_target", "def offload(models):\n    return 'offloaded'\n")
    write_module(
        tmp_path,
        "lazy_target",
        "import builtins\nbuiltins.LAZY_TARGET_RAN = True\n\ndef offload(models):\n    return 1\n",
    )
    import eager_target  # type: ignore[import-not-found]  # noqa: F401  (the patcher is loaded: rows count layers)

    lazy = load_lazily("lazy_target")

    rows = {r["name"]: r for r in shim.status()["targets"]}
    assert not hasattr(builtins, "LAZY_TARGET_RAN"), "status() executed a module the application did not"
    assert (rows["lazy_target:offload"]["state"], rows["lazy_target:offload"]["imported"]) == ("pending", False)
    assert lazy.offload([]) == 1  # the application's own first use runs it
    assert hasattr(builtins, "LAZY_TARGET_RAN")
    row = next(r for r in shim.status()["targets"] if r["name"] == "lazy_target:offload")
    assert (row["state"], row["layers"], row["imported"]) == ("patched", 1, True), row
