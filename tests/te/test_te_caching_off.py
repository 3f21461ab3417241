"""Caching off by configuration, on Transformer Engine's and Megatron's real classes: the reports say
why there is nothing to clear instead of a bare 0.

TE 2.20.2's own Python (harness/te_import.py: only the compiled extension replaced), megatron-core
0.16.1's TE wrappers built on it, and torch's FSDP2 (`fully_shard` over gloo, world size 1). No
forward runs here (TE's needs a GPU): the flags are the ones the real classes set, and the test reads
in the real releases' source that those are what their forwards decide caching by. One fresh
interpreter; this module imports nothing heavy at its top.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

import pytest
from support.set_up import needs

RELEASE = "2.20.2"
MEGATRON_OFF = "Megatron disable_parameter_transpose_cache"
FSDP2_OFF = "TE under FSDP2"


def offload_models(models: Any) -> str:
    """A user's own offload, patched through TE_OFFLOAD_SHIM_TARGETS in the test below."""
    return "offloaded"


def _te_layers() -> tuple[Any, ...]:
    """Megatron TELinear with disable_parameter_transpose_cache on, one with it off, one with it on
    that had cached before; TE's Linear under FSDP2."""
    import torch
    import transformer_engine.pytorch as te
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.transformer import TransformerConfig
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def linear(disable: bool) -> Any:
        config = TransformerConfig(
            num_layers=1,
            hidden_size=32,
            num_attention_heads=4,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            disable_parameter_transpose_cache=disable,
        )
        return mte.TELinear(
            32, 16, parallel_mode=None, config=config, init_method=torch.nn.init.zeros_, bias=False,
            skip_bias_add=False, skip_weight_param_allocation=False, tp_comm_buffer_name=None, is_expert=False,
        )  # fmt: skip

    off, on, cached_before = linear(True), linear(False), linear(True)
    cached_before._fp8_workspaces["weight"] = torch.zeros(16, 32, dtype=torch.uint8)
    fsdp2 = te.Linear(32, 16, params_dtype=torch.float32, device="cpu")
    fully_shard(fsdp2, mesh=init_device_mesh("cpu", (1,)))
    assert fsdp2.is_fsdp2, "TE's own property, as its forward reads it"
    return off, on, cached_before, fsdp2


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": f"{__name__}:offload_models"}, timeout=240)
def test_caching_off_by_configuration_is_said_not_reported_as_cleared(caplog: pytest.LogCaptureFixture) -> None:
    from harness import te_import, te_releases

    needs(te_releases.installed(RELEASE), f"TE {RELEASE} not in {te_releases.folder(RELEASE)}")
    te_import.load(RELEASE)  # before megatron-core, which picks TE or its own layers when imported
    import torch

    from harness import megatron_world as w

    w.init_world()  # gloo, world size 1
    torch.cuda.is_available = lambda: True  # TE's modules refuse to be built without CUDA; none runs here
    import transformer_engine.pytorch as te
    from megatron.core.extensions import transformer_engine as mte

    from te_offload_shim.reports.residue import residue
    from te_offload_shim.te.caches import clear_fp8_workspaces, scan

    # What the real releases do with these flags: Megatron hands TE no microbatch, TE names no cache
    assert "None if self.disable_parameter_transpose_cache else self.is_first_microbatch" in inspect.getsource(
        mte.TELinear.forward
    )
    assert 'cache_name = None if (is_first_microbatch is None or self.is_fsdp2) else "weight"' in inspect.getsource(
        te.Linear.forward
    )
    off, on, cached_before, fsdp2 = _te_layers()
    assert off.__dict__["disable_parameter_transpose_cache"] is True, "set by Megatron's wrapper from its config"

    chunk = torch.nn.Sequential(off, on, cached_before, fsdp2)
    report = scan([chunk])
    assert report.caching_off == {MEGATRON_OFF: 1, FSDP2_OFF: 1}, "not the layer that may cache, nor one that holds"
    assert report.entries == 1
    left = residue([chunk], device_type="cpu")
    assert left.caching_off == {MEGATRON_OFF: 1, FSDP2_OFF: 1}
    assert "FP8 weight caching off by configuration in 2 TE layers" in left.summary()
    assert clear_fp8_workspaces([chunk]).entries == 1 and not cached_before._fp8_workspaces, "cleared as any other"

    # Through a wrapped offload: the 0 says why, in stats() and in the log (once at the first line's level)
    import te_offload_shim

    this = sys.modules[__name__]
    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    models = [torch.nn.Sequential(off, on, fsdp2)]
    assert this.offload_models(models) == "offloaded"
    stats = te_offload_shim.stats()
    assert stats["entries"] == 0 and stats["calls"] == 1
    assert stats["caching_off"] == {MEGATRON_OFF: 1, FSDP2_OFF: 1}
    said = [r for r in caplog.records if "nothing to clear" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno >= logging.INFO, said
    assert said[0].getMessage() == (
        f"[rank 0] {__name__}:offload_models: nothing to clear: FP8 weight caching is off by configuration in "
        f"2 TE layers ({MEGATRON_OFF}, {FSDP2_OFF})"
    ), "the target, and why"
    row = next(r for r in te_offload_shim.status()["targets"] if r["name"] == f"{__name__}:offload_models")
    assert row["state"] == "patched"
    assert row["detail"] == (
        "nothing to clear at its last call: FP8 weight caching is off by configuration in "
        f"2 TE layers ({MEGATRON_OFF}, {FSDP2_OFF})"
    )
    this.offload_models(models)
    said = [r for r in caplog.records if "nothing to clear" in r.getMessage()]
    assert [r.levelno for r in said][1:] == [logging.DEBUG], "said once; after that at debug level"
    this.offload_models([torch.nn.Sequential(on)])
    assert te_offload_shim.stats()["caching_off"] == {}, "what the last call found"
    row = next(r for r in te_offload_shim.status()["targets"] if r["name"] == f"{__name__}:offload_models")
    assert row["detail"] == "", "its last call found caching on"
