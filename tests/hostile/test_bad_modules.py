"""Scenario 11: the offload always runs and clears what it can.

A module that cannot be read costs only itself; a tree deeper than the recursion limit is cleared
and named; a buffer whose DDP is gone is not searched for again at every offload.
"""

from __future__ import annotations

import pytest


@pytest.mark.subprocess(verl="0.8.0")
def test_a_module_whose_dict_raises_costs_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    import verl.utils.megatron_utils as mu

    import te_offload_shim as shim
    from harness import megatron_world as w
    from harness import te_standins as te
    from te_offload_shim.te.caches import ShimError

    Sealed = te.SealedLinearStandIn

    model = w.wrap_ddp(w.build_gpt(layers=2, hidden=16, vocab=32))
    odd, inner = Sealed(8, 8), te.TELinearStandIn(8, 8)
    odd.add_module("inner", inner)  # a healthy layer below the odd one
    model.module.decoder.layers[0].add_module("odd", odd)

    def fill() -> None:
        Sealed.sealed = False
        w.attach_fp8_caches(model)
        te.fill_like_forward(odd)
        te.fill_like_forward(inner)
        Sealed.sealed = True

    def cached() -> list[str]:
        Sealed.sealed = False  # the test's own look, unsealed
        try:
            return sorted(n for n, m in model.named_modules() if m.__dict__.get("_fp8_workspaces"))
        finally:
            Sealed.sealed = True

    fill()
    everything = cached()
    odd_name = "module.decoder.layers.0.odd"
    assert odd_name in everything and f"{odd_name}.inner" in everything and len(everything) > 3

    mu.offload_megatron_model_to_cpu([model])
    assert all(b.param_data.untyped_storage().size() == 0 for b in model.buffers), "the offload ran"
    assert cached() == [odd_name], "every layer but the unreadable one was cleared"
    stats = shim.stats()
    assert stats["errors"] == 1 and stats["entries"] == len(everything) - 1
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "te_offload_shim" and "FP8 weight workspaces in" not in r.getMessage()
    ]  # the problems, not the clearing's own line
    assert len(warned) == 1 and f"chunk0.{odd_name}" in warned[0] and "sealed module" in warned[0]
    mu.load_megatron_model_to_gpu([model])

    # Strict mode: the same walk clears every healthy layer first, then raises.
    fill()
    with pytest.raises(ShimError, match=f"chunk0.{odd_name}: RuntimeError: sealed module"):
        shim.clear_fp8_workspaces([model], strict=True)
    assert cached() == [odd_name]

    # The chunk itself unreadable: nothing of it is cleared (its CUDA-graph settings cannot be read),
    # the next chunk is.
    fill()
    healthy = te.TELinearStandIn(8, 8)
    te.fill_like_forward(healthy)
    report = shim.clear_fp8_workspaces([odd, healthy])
    assert not healthy._fp8_workspaces and report.entries == 1
    assert [e.split(":")[0] for e in report.errors] == ["chunk0", "chunk0"]


@pytest.mark.subprocess()
def test_a_tree_deeper_than_the_recursion_limit_is_cleared_and_named() -> None:
    import itertools
    import sys

    import torch

    import te_offload_shim as shim
    from harness import te_standins as te

    depth = 5000
    assert depth > sys.getrecursionlimit()
    chain = [torch.nn.Module() for _ in range(depth)]
    for parent, child in itertools.pairwise(chain):
        parent.add_module("next", child)
    legacy, modern = chain[-1], te.TELinearStandIn(8, 8)
    te.attach_legacy(legacy, [torch.randn(8, 8)])  # TE < 1.8: a skip record, with the module's name
    chain[-1].add_module("te", modern)
    te.fill_like_forward(modern)

    report = shim.clear_fp8_workspaces(chain[0], strict=True)
    assert report.entries == 1 and not modern._fp8_workspaces
    assert [s.where for s in report.skipped] == ["chunk0" + ".next" * (depth - 1)]
    assert report.errors == []


@pytest.mark.subprocess()
def test_a_buffer_whose_ddp_is_gone_is_never_searched_for_again() -> None:
    import gc
    import weakref

    import te_offload_shim as shim
    from harness import megatron_world as w

    scans = []
    real = gc.get_objects

    def counted(*args: object, **kwargs: object) -> list:
        scans.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    gc.get_objects = counted
    try:
        ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
        w.attach_fp8_caches(ddp)
        buffer = ddp.buffers[0]
        buffer.offload_to_cpu()  # the first offload of an unknown buffer: one search finds its DDP
        assert len(scans) == 1 and w.cache_state([ddp])["entries"] == 0
        buffer.reload_from_cpu()
        owner = weakref.ref(ddp)
        del ddp
        gc.collect()
        assert owner() is None, "the buffer outlives its DDP"
        for _ in range(3):
            buffer.offload_to_cpu()
            assert buffer.param_data.untyped_storage().size() == 0, "the offload itself still runs"
            buffer.reload_from_cpu()
        assert len(scans) == 1, f"{len(scans) - 1} heap scans for a buffer whose DDP is gone"
        assert shim.stats()["calls"] == 4
    finally:
        gc.get_objects = real
