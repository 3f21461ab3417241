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
    said = [r.getMessage() for r in caplog.records if r.name == "te_offload_shim" and "Parallel" in r.getMessage()]
    assert len(said) == 1 and "clear nothing" in said[0], said
    row = next(r for r in shim.status()["targets"] if r["name"] == "megatron-core")
    assert row["state"] == "patched", row
    assert "OwnerNotFound" in row["detail"] and "no megatron DistributedDataParallel" in row["detail"], row


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_DISABLE": "*"})
def test_the_net_armed_after_gc_freeze_says_what_it_did_not_search(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shim imported after TE and after `gc.freeze()` (vLLM's and SGLang's warm-up): the TE
    layer built before is frozen, so the net cannot find it and its caches stay through an offload.
    That is said: one warning (how many objects, what it means, the fix), the count in the net's
    `status` row, its line of `te-offload-shim status`, and `stats()["net"]`. TE 2.20.2's own
    `Linear` on the twin."""
    import gc

    from support import net_case

    te = net_case.load()  # TE imported, the shim not yet
    layer = net_case.cached_linear(te)
    gc.freeze()
    try:
        frozen_before = gc.get_freeze_count()
        caplog.set_level(logging.INFO, logger="te_offload_shim")
        import te_offload_shim as shim
        from te_offload_shim import cli

        net_case.offload_off_the_device_type(layer)
        import torch

        torch.cuda.empty_cache()
    finally:
        gc.unfreeze()
    assert net_case.entries(layer) == 1, "the frozen layer was not found: its cache stays (what the warning says)"
    said = [r for r in caplog.records if "gc.freeze()" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
    row = shim.status()["net"]
    frozen = row["frozen_not_searched"]
    assert row["state"] == "armed" and 0 < frozen <= frozen_before, row  # a frozen object may have died since
    assert shim.stats()["net"]["frozen_not_searched"] == frozen
    assert said[0].getMessage() == (  # word for word (the logger's name stands for the "te_offload_shim: ")
        f"{frozen} objects frozen by gc.freeze() were not searched for TE layers: a layer built before the shim "
        "was imported may keep its FP8 caches through an offload. Import the shim at start-up, before the heap "
        "is frozen (every route of docs/cluster.md does)"
    )
    capsys.readouterr()
    cli.main(["status"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("flush net:")]
    assert len(printed) == 1 and f"{frozen} objects frozen by gc.freeze() not searched" in printed[0], printed
