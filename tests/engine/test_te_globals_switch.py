"""`TE_OFFLOAD_SHIM_TE_GLOBALS=1`: a wrapped offload also gives back TE's `_dummy_wgrads`, after its
clearing, never where a CUDA graph may hold them; off (the default) it touches no TE global.

Through a real table entry (megatron-core 0.16.1's buffer offload on a real megatron DDP), with TE's
module globals laid out as in module/base.py (2.4 - 2.20: a dict keyed by shape and dtype); TE's own
backward filling them, and rebuilding them, is tests/twin/test_twin_te_globals.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

F32 = 4


def _te_base() -> Any:
    import sys
    import types

    import torch

    base = types.ModuleType("transformer_engine.pytorch.module.base")
    base._dummy_wgrads = {(64, 64, torch.float32): torch.empty(64, 64), (128, 64, torch.float32): torch.empty(128, 64)}  # type: ignore[attr-defined]
    sys.modules[base.__name__] = base
    return base


def _offload() -> Any:
    from harness import megatron_world as w

    ddp = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    w.attach_fp8_caches(ddp)
    ddp.buffers[0].offload_to_cpu()
    return ddp


@pytest.mark.subprocess(timeout=240)
def test_off_by_default_then_given_back_after_the_clearing_never_under_cuda_graphs() -> None:
    import te_offload_shim as shim
    from harness import megatron_world as w

    base = _te_base()
    _offload()
    assert len(base._dummy_wgrads) == 2 and shim.stats()["te_globals"]["calls"] == 0, "off by default"

    os.environ["TE_OFFLOAD_SHIM_TE_GLOBALS"] = "1"  # read at each offload
    ddp = _offload()
    assert w.cache_state(ddp)["entries"] == 0 and base._dummy_wgrads == {}
    got = shim.stats()["te_globals"]
    assert (got["calls"], got["entries"], got["bytes"]) == (1, 2, (64 * 64 + 128 * 64) * F32)

    base._dummy_wgrads[(8, 8, None)] = __import__("torch").empty(8, 8)
    graphed = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    graphed.config.enable_cuda_graph = True  # Megatron's switch: the chunk is graphed
    w.attach_fp8_caches(graphed)
    graphed.buffers[0].offload_to_cpu()
    assert w.cache_state(graphed)["entries"] > 0, "a graphed chunk keeps its caches"
    assert len(base._dummy_wgrads) == 1, "and TE's globals stay: a graph may have captured them"
    assert shim.stats()["te_globals"]["kept"] == {"a chunk of this call is CUDA-graphed": 1}


@pytest.mark.subprocess(timeout=240, env={"TE_OFFLOAD_SHIM_TE_GLOBALS": "maybe"})
def test_a_value_it_does_not_understand_warns_and_stays_off(caplog: pytest.LogCaptureFixture) -> None:
    import te_offload_shim  # noqa: F401  (installs: the switches are checked then)

    base = _te_base()
    _offload()
    assert len(base._dummy_wgrads) == 2
    assert "TE_OFFLOAD_SHIM_TE_GLOBALS='maybe' is not 1/0" in caplog.text and "it stays off" in caplog.text


@pytest.mark.subprocess(timeout=240, env={"TE_OFFLOAD_SHIM_TE_GLOBALS": "1"})
def test_each_giving_back_is_said_the_first_at_info_and_none_to_give_back_is_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    import te_offload_shim as shim

    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    _offload()  # TE's module is not there: nothing to give back, nothing said, no failure
    base = _te_base()
    base._dummy_wgrads.clear()
    _offload()  # TE holds none
    base = _te_base()
    _offload()
    base._dummy_wgrads[(8, 8, None)] = __import__("torch").empty(8, 8)
    _offload()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "gave back" in r.getMessage()]
    assert said == [
        (logging.INFO, "[rank 0] gave back TE's _dummy_wgrads: 2 tensors, 48.00 KiB"),
        (logging.DEBUG, "[rank 0] gave back TE's _dummy_wgrads: 1 tensors, 256 B"),
    ]
    got = shim.stats()
    assert got["errors"] == 0 and got["te_globals"]["calls"] == 2, got
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
