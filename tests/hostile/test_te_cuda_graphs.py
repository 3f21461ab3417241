"""Scenario 12: a chunk that TE's own `make_graphed_callables` captured is never cleared.

A captured graph replays into the workspace addresses it recorded; freed, replay reads and writes
memory that now belongs to someone else. TE marks the module it graphs (transformer_engine/pytorch/
graph.py): the marks here are made by TE's real code from each release's wheel in `.deps/te-X`
(harness/te_graph.py runs graph.py's own nested functions; tests/te/test_te_real.py does the same with
TE's modules really imported), never typed by hand.
"""

from __future__ import annotations

import pytest
from support.set_up import needs


def _chunk() -> tuple:
    import torch

    from harness import te_standins as te

    layer = torch.nn.Module()  # a transformer layer, the unit megatron and users graph
    layer.linear = te.TELinearStandIn(16, 16)
    te.fill_like_forward(layer.linear)
    return torch.nn.Sequential(layer), layer


@pytest.mark.subprocess(timeout=120)
def test_chunk_graphed_by_te_make_graphed_callables_is_left_alone() -> None:
    from harness import te_graph, te_releases
    from te_offload_shim.te.caches import clear_fp8_workspaces, scan

    releases = [r for r in te_releases.RELEASES if te_releases.installed(r)]
    needs(bool(releases), "no TE release in .deps")
    failures = []
    for release in releases:
        source = str(te_releases.folder(release) / te_graph.GRAPH)
        for order in (False, True):
            chunk, layer = _chunk()
            te_graph.mark_like_make_graphed_callables(layer, te_releases.folder(release), order=order)
            marks = {n: v for n, v in vars(layer).items() if getattr(v, "__module__", None) == te_graph.MODULE}
            assert all(v.__code__.co_filename == source for v in marks.values()), "TE's own code made them"
            if order and te_releases.key(release) >= (2, 8):
                # 2.8+ with `_order` (megatron's TECudaGraphHelper) leave nothing on the module: the
                # mark there is megatron's `cuda_graphs` list (tests/te/test_te_caches.py).
                assert not marks, (release, sorted(marks))
                continue
            expected = "new_fwd" if not order else "forward_func"
            assert marks["forward"].__name__ == expected, (release, order, marks)
            seen, report = scan(chunk), clear_fp8_workspaces(chunk)
            kept = len(layer.linear._fp8_workspaces)
            if report.entries or kept != 1 or seen.entries or "make_graphed_callables" not in report.skipped[0].reason:
                failures.append(f"{release} _order={order}: cleared {report.entries}, left {kept}, {report.skipped}")
        if te_releases.key(release) >= (2, 10):  # reset / backward_dw alone (forward put back by the user)
            chunk, layer = _chunk()
            te_graph.mark_like_make_graphed_callables(layer, te_releases.folder(release))
            del layer.forward
            report = clear_fp8_workspaces(chunk)
            if report.entries or "reset" not in report.skipped[0].reason:
                failures.append(f"{release} reset/backward_dw only: cleared {report.entries}, {report.skipped}")
    assert not failures, "\n".join(failures)
    assert {"1.9.0", "2.10.0", "2.20.2"} <= set(releases) or len(releases) < len(te_releases.RELEASES)


def test_instance_forwards_that_are_not_te_graphs_do_not_block_clearing() -> None:
    """Hooks and wrappers people set on `forward` (functools.partial, lambdas, a profiler's
    function) are not graphs: only functions of TE's graph module count."""
    import functools

    from te_offload_shim.te.caches import clear_fp8_workspaces

    chunk, layer = _chunk()
    layer.forward = functools.partial(type(layer).forward, layer)
    layer.reset = lambda: None
    layer.backward_dw = "not a function"
    assert clear_fp8_workspaces(chunk).entries == 1


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM": "0"}, timeout=120)
def test_direct_clearing_with_the_shim_off_leaves_a_megatron_graphed_chunk() -> None:
    """`TE_OFFLOAD_SHIM=0`: nothing is patched, so nothing loads integrations/ before the user's own
    `clear_fp8_workspaces` call. The call hands te/ Megatron's marks all the same (api.py): a chunk
    whose megatron-core TransformerConfig turns CUDA graphs on keeps its caches, as in scan."""
    import sys

    from megatron.core.transformer import TransformerConfig

    import te_offload_shim as shim

    assert not shim.installed() and "te_offload_shim.integrations" not in sys.modules
    chunk, layer = _chunk()
    chunk.config = TransformerConfig(  # type: ignore[assignment]  # megatron's modules carry it
        num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True, cuda_graph_impl="local"
    )
    for report in (shim.scan([chunk]), shim.clear_fp8_workspaces([chunk])):
        assert report.entries == 0, report
        assert report.skipped[0].reason == "CUDA graphs: config.cuda_graph_impl='local'"
    assert len(layer.linear._fp8_workspaces) == 1, "nothing cleared"
