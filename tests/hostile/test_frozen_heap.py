"""The megatron-core target's search for a buffer's DDP, whatever the collector's state.

vLLM (`freeze_gc_heap`, after its warm-up) and SGLang (`freeze_gc`) call `gc.freeze()`, in the same
process as the trainer in colocated RL: every object moves to a permanent generation that
`gc.get_objects()` does not list. A worker that froze its heap before the first buffer offload must
still have the caches of every layer in the buffer cleared; a search that finds no DDP says so, in
`status` and once in the log. Real megatron-core DDP (harness/megatron_world.py).
"""

from __future__ import annotations

import logging
import sys

import pytest


def _offload_every_buffer(ddp: object) -> None:
    for buffer in ddp.buffers + ddp.expert_parallel_buffers:  # type: ignore[attr-defined]
        buffer.offload_to_cpu()
        assert buffer.param_data.untyped_storage().size() == 0, "the offload itself ran"


@pytest.mark.subprocess()
def test_a_ddp_built_before_gc_freeze_is_found_and_its_buffers_caches_cleared() -> None:
    import gc

    import te_offload_shim as shim
    from harness import megatron_world as w

    ddp = w.wrap_ddp(w.build_gpt(layers=2, hidden=16, vocab=32))
    entries = w.attach_fp8_caches(ddp)
    holder = _worker_module()
    holder["actor"] = [ddp]  # a worker object a module refers to, as Ray's worker refers to its actor
    del ddp
    gc.freeze()  # as vLLM's freeze_gc_heap after its warm-up: the DDP is in the permanent generation
    try:
        assert not any(type(o).__name__ == "DistributedDataParallel" for o in gc.get_objects())
        _offload_every_buffer(holder["actor"][0])
        left = w.cache_state(holder["actor"])["entries"]
        stats = shim.stats()
    finally:
        gc.unfreeze()
    assert (entries, left) == (9, 0), f"{left} of {entries} caches left after gc.freeze()"
    assert (stats["entries"], stats["errors"]) == (entries, 0), stats


def _worker_module() -> dict:
    import types

    module = sys.modules["frozen_heap_worker"] = types.ModuleType("frozen_heap_worker")
    module.state = {}  # type: ignore[attr-defined]
    return module.state  # type: ignore[attr-defined]


@pytest.mark.skipif(sys.version_info < (3, 13), reason="a frame's locals are read from 3.13 (PEP 667) only")
@pytest.mark.subprocess()
def test_a_ddp_whose_only_holder_is_a_frame_is_found_in_a_frozen_heap() -> None:
    import gc

    import te_offload_shim as shim
    from harness import megatron_world as w

    def worker() -> tuple[int, int]:
        ddp = w.wrap_ddp(w.build_gpt(layers=2, hidden=16, vocab=32))  # a local, and nothing else
        entries = w.attach_fp8_caches(ddp)
        gc.freeze()
        try:
            _offload_every_buffer(ddp)
        finally:
            gc.unfreeze()
        return entries, w.cache_state([ddp])["entries"]

    assert worker() == (9, 0)
    assert shim.stats()["errors"] == 0


@pytest.mark.subprocess()
def test_the_owner_search_finds_the_ddp_with_the_collector_disabled() -> None:
    import gc

    import te_offload_shim as shim
    from harness import megatron_world as w

    gc.disable()
    ddp = w.wrap_ddp(w.build_gpt(layers=2, hidden=16, vocab=32))
    entries = w.attach_fp8_caches(ddp)
    _offload_every_buffer(ddp)
    assert (entries, w.cache_state([ddp])["entries"], shim.stats()["entries"]) == (9, 0, 9)
    assert not gc.isenabled(), "the collector is left as the application set it"


@pytest.mark.subprocess()
def test_a_search_that_finds_no_ddp_says_so_in_status_and_once_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    import gc

    import te_offload_shim as shim
    from harness import megatron_world as w

    caplog.set_level(logging.INFO)
    ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    buffer = ddp.buffers[0]
    del ddp
    gc.collect()  # the buffer outlives its DDP before its first offload: no DDP holds it
    for _ in range(3):
        buffer.offload_to_cpu()
        assert buffer.param_data.untyped_storage().size() == 0, "the offload itself ran"
        buffer.reload_from_cpu()
    said = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("te_offload_shim") and "Parallel" in m]
    assert len(said) == 1 and "clear nothing" in said[0], said
    row = next(r for r in shim.status()["targets"] if r["name"] == "megatron-core")
    assert row["state"] == "patched", row
    assert "OwnerNotFound" in row["detail"] and "no megatron DistributedDataParallel" in row["detail"], row
