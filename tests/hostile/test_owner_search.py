"""The megatron-core target's search for the DDP that holds a buffer: types only, failures remembered.

The first offload of an unknown buffer walks the collector's objects once to find the DDP that
holds it. That walk must read nothing but each object's type: a lazily loaded module loads itself
on any attribute read (and `isinstance` reads `__class__` when the type check fails), and a lazy
proxy may raise from `__class__`. A search that fails is remembered like one that found nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostile_util import load_lazily, write_module


def _counting_scans() -> tuple[list[int], Any]:
    """Count the heap walks (calls of gc.get_objects) from now on; returns (counter, the real one)."""
    import gc

    scans: list[int] = []
    real = gc.get_objects

    def counted(*args: Any, **kwargs: Any) -> list:
        scans.append(1)
        return real(*args, **kwargs)

    gc.get_objects = counted
    return scans, real


@pytest.mark.subprocess()
def test_the_owner_search_leaves_a_lazily_loaded_module_unloaded(tmp_path: Path) -> None:
    import builtins

    import te_offload_shim  # noqa: F401  (installs the shim: megatron-core's buffer offload is a target)
    from harness import megatron_world as w

    ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    entries = w.attach_fp8_caches(ddp)
    write_module(tmp_path, "lazily_loaded", "import builtins\nbuiltins.LAZILY_LOADED_RAN = True\n")
    load_lazily("lazily_loaded")  # as lazy_loader / networkx do: the body runs at the first attribute read
    assert not hasattr(builtins, "LAZILY_LOADED_RAN")

    ddp.buffers[0].offload_to_cpu()
    assert w.cache_state([ddp])["entries"] == 0 < entries, "the buffer's owner was found and cleared"
    assert not hasattr(builtins, "LAZILY_LOADED_RAN"), "the shim executed a module the application did not"


class _Unconfigured:
    """A lazy proxy before its set-up, as Django's `LazyObject` is before settings are configured:
    every attribute read raises, `__class__` included."""

    @property  # type: ignore[misc]  # deliberately: a __class__ that raises
    def __class__(self) -> type:
        raise RuntimeError("settings are not configured")


@pytest.mark.subprocess()
def test_an_object_whose_class_raises_costs_only_itself() -> None:
    import te_offload_shim as shim
    from harness import megatron_world as w

    odd = _Unconfigured()  # alive in the heap while the buffer's owner is searched for
    scans, real = _counting_scans()
    try:
        ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
        buffer = ddp.buffers[0]
        for _ in range(3):
            entries = w.attach_fp8_caches(ddp)
            buffer.offload_to_cpu()
            assert buffer.param_data.untyped_storage().size() == 0, "the offload itself ran"
            assert w.cache_state([ddp])["entries"] == 0 < entries, "the caches were cleared"
            buffer.reload_from_cpu()
        assert len(scans) == 1, f"{len(scans)} heap walks for one buffer"
        stats = shim.stats()
        assert (stats["calls"], stats["errors"]) == (3, 0), stats
    finally:
        import gc

        gc.get_objects = real
    del odd


@pytest.mark.subprocess()
def test_a_buffer_whose_owner_search_failed_is_never_searched_again_and_status_says_so() -> None:
    import gc

    import te_offload_shim as shim
    from harness import megatron_world as w

    attempts: list[int] = []
    real = gc.get_objects

    def failing(*args: Any, **kwargs: Any) -> list:
        attempts.append(1)
        raise MemoryError("no memory for the list of objects")

    ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    buffer = ddp.buffers[0]
    gc.get_objects = failing
    try:
        for _ in range(3):
            w.attach_fp8_caches(ddp)
            buffer.offload_to_cpu()
            assert buffer.param_data.untyped_storage().size() == 0, "the offload itself ran"
            buffer.reload_from_cpu()
    finally:
        gc.get_objects = real
    assert len(attempts) == 1, f"{len(attempts)} heap walks for one buffer whose search failed"
    assert shim.stats()["errors"] == 1, "the failed search is the shim's error, counted once"
    row = next(r for r in shim.status()["targets"] if r["name"] == "megatron-core")
    assert row["state"] == "patched" and row["layers"] == 1, row
    assert "MemoryError" in row["detail"] and "owns a buffer" in row["detail"], row
