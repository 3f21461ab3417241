"""The flush net knows every TE layer, however it was made (issue 34, item 2).

A layer made by `copy.deepcopy` (a reference policy, an EMA model), by unpickling (pickle,
cloudpickle to a Ray actor, `torch.load` of a whole module, also in another process) never runs
TE's base `__init__`: `__reduce_ex__` gives `copyreg.__newobj__` (`cls.__new__`) and the state is
put back by `nn.Module.__setstate__`. A layer built on the meta device and materialised by
`nn.Module.to_empty` runs `__init__` once, on the meta device. On TE 2.20.2's own `Linear` (the
CPU twin of its extension): each layer makes its FP8 workspace in a forward, every parameter is
then moved off the device (to `meta`: on the twin every CPU tensor counts as of the device type)
and the allocator flushed;
with `TE_OFFLOAD_SHIM_NET=0` as the baseline every cache stays, with the net on none does. No
table row is in play (`TE_OFFLOAD_SHIM_DISABLE=*`).
"""

from __future__ import annotations

import copy
import gc
import io
import multiprocessing
import os
import pickle
import weakref
from typing import Any

import pytest

RELEASE = "2.20.2"
NO_ROWS = {"TE_OFFLOAD_SHIM_DISABLE": "*", "TE_OFFLOAD_SHIM_STRICT": "1"}
HIDDEN = 32


def _te() -> Any:
    import te_offload_shim  # noqa: F401  (as its start-up hook would: before TE)
    from harness import te_twin

    return te_twin.load(RELEASE)


def _linear(te: Any, **kwargs: Any) -> Any:
    """TE's `Linear` with an initialiser that pickles (TE's default is a local function)."""
    import functools

    import torch

    init = functools.partial(torch.nn.init.normal_, std=0.02)
    return te.Linear(HIDDEN, HIDDEN, params_dtype=torch.float32, init_method=init, bias=False, **kwargs)


def _forward(layer: Any) -> int:
    """One FP8 forward of `layer` (its workspace made by TE's own code); the caches it holds."""
    import torch

    from harness import te_twin
    from harness.te_twin import training

    with te_twin.autocast(training.make_recipe("DelayedScaling")):
        layer(torch.randn(16, HIDDEN), is_first_microbatch=True)
    return len(layer.__dict__["_fp8_workspaces"])


def _offload_and_flush(layers: list[Any]) -> list[int]:
    """Every parameter moved off the device, then the flush: the caches left per layer."""
    import torch

    for layer in layers:
        layer.to("meta")
    torch.cuda.empty_cache()
    return [len(layer.__dict__["_fp8_workspaces"]) for layer in layers]


def _copies(te: Any, original: Any) -> dict[str, Any]:
    """The same layer made five other ways, none of which runs `__init__` on it but the meta one."""
    import cloudpickle
    import torch

    buffer = io.BytesIO()
    torch.save(original, buffer)
    buffer.seek(0)
    meta = _linear(te, device="meta")
    return {
        "deepcopy": copy.deepcopy(original),
        "pickle": pickle.loads(pickle.dumps(original)),
        "cloudpickle": cloudpickle.loads(cloudpickle.dumps(original)),
        "torch.load": torch.load(buffer, weights_only=False),
        "to_empty": meta.to_empty(device="cuda"),  # the twin's "cuda" is the CPU
    }


@pytest.mark.subprocess(env=NO_ROWS, timeout=300)
def test_layers_made_by_deepcopy_pickle_cloudpickle_torch_load_and_to_empty_are_cleared_and_not_kept_alive() -> None:

    import te_offload_shim as shim

    te = _te()
    results: dict[bool, list[int]] = {}
    refs: list[weakref.ref] = []
    for on in (False, True):
        os.environ["TE_OFFLOAD_SHIM_NET"] = "1" if on else "0"
        original = _linear(te)
        layers = [original, *_copies(te, original).values()]
        assert [_forward(layer) for layer in layers] == [1] * 6, "each layer makes its own workspace"
        results[on] = _offload_and_flush(layers)
        refs += [weakref.ref(layer) for layer in layers]
        del original, layers
    os.environ.pop("TE_OFFLOAD_SHIM_NET")
    assert results[False] == [1] * 6, "the net off: every cache stays (the baseline)"
    assert results[True] == [0] * 6, f"the net on: every layer's cache cleared, however made ({results[True]})"
    assert shim.status()["net"]["layers"] == 6, shim.status()["net"]
    gc.collect()
    assert all(ref() is None for ref in refs), "the net keeps no layer alive"
    assert shim.status()["net"]["live_layers"] == 0

    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule as base

    init = vars(base)["__init__"]
    assert "__setstate__" in vars(base), "the net gave TE's base class a __setstate__"
    shim.uninstall()
    assert "__setstate__" not in vars(base) and vars(base)["__init__"] is init.__wrapped__, "put back exactly"


def _unpickle_in_another_process(blob: bytes, answers: Any) -> None:
    """A fresh interpreter (spawn, as a Ray worker is): the shim at start-up, TE on the twin, then
    the layer unpickled, offloaded and flushed; answers (caches before, after, layers the net knew)."""
    import cloudpickle

    import te_offload_shim as shim

    _te()
    layer = cloudpickle.loads(blob)
    before = _forward(layer)
    after = _offload_and_flush([layer])[0]
    answers.put((before, after, shim.status()["net"]["live_layers"]))


@pytest.mark.subprocess(env=NO_ROWS, timeout=300)
def test_a_layer_cloudpickled_to_another_process_is_known_there() -> None:
    import cloudpickle

    te = _te()
    blob = cloudpickle.dumps(_linear(te))
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    child = context.Process(target=_unpickle_in_another_process, args=(blob, answers))
    child.start()
    try:
        got = answers.get(timeout=240)
    finally:
        child.join(timeout=60)
    assert got == (1, 0, 1), f"(caches before, after the flush, layers known) in the other process: {got}"
