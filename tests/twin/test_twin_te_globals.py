"""TE's `_dummy_wgrads`, the process-global placeholder gradients its layers hand autograd under
Megatron's `fuse_wgrad_accumulation`, made by TE's own backward on the twin, and what
`TE_OFFLOAD_SHIM_TE_GLOBALS` gives back of them (te_offload_shim/te/process_globals.py): the bytes
counted, the tensors freed, the next step's backward re-creating them with the same results."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest

pytestmark = pytest.mark.twin

F32 = 4


def _layer(seed: int) -> Any:
    """TE's Linear with Megatron's wgrad fusion: a `main_grad` to accumulate into, and the flag TE sets."""
    import torch

    from harness.te_twin import training

    torch.manual_seed(seed)
    layer = training.te().Linear(
        training.HIDDEN, training.OUT, params_dtype=torch.float32, fuse_wgrad_accumulation=True
    )
    layer.weight.main_grad = torch.zeros_like(layer.weight)
    layer.weight.grad_added_to_main_grad = False
    return layer


def _step(layer: Any, step: int) -> Any:
    from harness import te_twin
    from harness.te_twin import training

    with te_twin.autocast(training.make_recipe("DelayedScaling")):
        y = training.forward(layer, training.batch(step, 0), True)
    y.float().square().mean().backward()
    layer.weight.grad = None  # what Megatron's DDP hook does once the gradient is in main_grad
    layer.weight.grad_added_to_main_grad = False
    return y.detach()


def test_dummy_wgrads_are_given_back_and_rebuilt_by_te(release: str) -> None:
    import torch

    from te_offload_shim.te import process_globals
    from te_offload_shim.te.caches import clear_fp8_workspaces
    from te_offload_shim.te.report import CacheReport, Skipped

    base = sys.modules["transformer_engine.pytorch.module.base"]
    if "_dummy_wgrads" not in vars(base):
        pytest.skip(f"TE {release} has no _dummy_wgrads (module/base.py)")
    kept, given = _layer(0), _layer(0)
    _step(kept, 0)
    _step(given, 0)
    dummies = dict(base._dummy_wgrads)
    assert list(dummies) and all(t.shape == (128, 128) for t in dummies.values()), "TE's own backward made them"
    expected = 128 * 128 * F32  # one per (shape, dtype): both layers share it
    assert sum(t.untyped_storage().nbytes() for t in dummies.values()) == expected
    refs = [weakref.ref(t) for t in dummies.values()]
    del dummies

    graphed = CacheReport(skipped=[Skipped("chunk0", "CUDA graphs: config.cuda_graph_impl='local'", 1)])
    kept_back = process_globals.give_back(graphed)
    assert base._dummy_wgrads and kept_back == process_globals.GivenBack(kept="a chunk of this call is CUDA-graphed")

    done = process_globals.give_back(clear_fp8_workspaces(given))
    assert base._dummy_wgrads == {}
    assert done == process_globals.GivenBack(entries=1, bytes=expected)
    gc.collect()
    assert [r() for r in refs] == [None], "freed: nothing else held them"

    for step in (1, 2):  # TE re-creates what it needs; the arithmetic is the same as keeping them
        assert torch.equal(_step(kept, step), _step(given, step))
        assert torch.equal(kept.weight.main_grad, given.weight.main_grad)
    assert len(base._dummy_wgrads) == 1
