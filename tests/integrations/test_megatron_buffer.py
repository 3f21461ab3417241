"""Megatron's own offload, `_ParamAndGradBuffer.offload_to_cpu`, on real megatron-core releases.

Real `GPTModel`s wrapped in real megatron DDP (harness/megatron_world.py), TE-layout caches on their
linears. One chunk is a MoE model whose expert weights get a buffer of their own, so "the layers in
that buffer" is a strict subset of the chunk. Each case runs in a fresh interpreter with the chosen
megatron-core release first on the path (0.16.1 is the venv's, 0.16.0 and 0.15.3 are --no-deps folders).
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
import weakref
from typing import Any

import pytest
from conftest import DEPS, REPO
from support.set_up import missing

VENV_RELEASE = "0.16.1"
OTHER_RELEASE = "0.16.0"
WITHOUT_METHOD = "0.15.3"  # every PyPI release before 0.16.0 lacks offload_to_cpu


def megatron_env(release: str) -> dict[str, str]:
    """PYTHONPATH putting `release` first (the venv's megatron-core is the fallback)."""
    paths = [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    if release != VENV_RELEASE:
        paths.append(str(DEPS / f"megatron-core-{release}"))
    paths.append(str(REPO))
    return {"PYTHONPATH": os.pathsep.join(paths)}


def on_release(release: str) -> Any:
    """A fresh interpreter with `release` first on the path (skipped when it is not installed)."""
    folder = DEPS / f"megatron-core-{release}"
    if release != VENV_RELEASE and not (folder / "megatron").is_dir():
        return missing(f"megatron-core {release} not installed in {folder}")
    return pytest.mark.subprocess(env=megatron_env(release))


def moe_chunk() -> Any:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from harness import megatron_world as w

    w.init_world()
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=True,
        bf16=False,
        params_dtype=torch.float32,
        num_moe_experts=2,
        moe_router_topk=2,
        ffn_hidden_size=128,
    )
    model = GPTModel(cfg, get_gpt_layer_local_spec(num_experts=2), vocab_size=128, max_sequence_length=32)
    # With expert parallelism megatron marks expert weights allreduce=False (experts.py, TE layers);
    # DDP then keeps them in expert_parallel_buffers, apart from the dense weights.
    for name, p in model.named_parameters():
        if ".experts." in name:
            p.allreduce = False
    return w.wrap_ddp(model)


def cached(ddp: Any) -> list[str]:
    return sorted(n for n, m in ddp.named_modules() if m.__dict__.get("_fp8_workspaces"))


def layers_in(buffer: Any, ddp: Any) -> list[str]:
    from harness import megatron_world as w

    ids = {id(p) for p in buffer.params}
    return sorted(n for n, m in w.linear_layers(ddp) if any(id(p) in ids for p in m.parameters(recurse=False)))


def reload(ddp: Any) -> None:
    for b in ddp.buffers + ddp.expert_parallel_buffers:
        b.reload_from_cpu()


def scenario(a: Any, b: Any, release: str) -> None:
    """Chunks a (MoE: dense + expert buffer) and b (dense) exist when this runs; c is built in it."""
    from megatron.core import package_info
    from megatron.core.distributed import DistributedDataParallel as DDP

    import te_offload_shim as shim
    from harness import megatron_world as w
    from te_offload_shim.engine import patch as _patch
    from te_offload_shim.engine import registry as _registry
    from te_offload_shim.integrations import megatron_ddp as megatron_buffers

    scans = []
    real_scan = megatron_buffers._scan

    def counting_scan() -> Any:
        scans.append(1)
        return real_scan()

    megatron_buffers._scan = counting_scan
    assert package_info.__version__ == release
    for ddp in (a, b):
        w.attach_fp8_caches(ddp)
    all_a, all_b = cached(a), cached(b)
    dense_a, expert_a = layers_in(a.buffers[0], a), layers_in(a.expert_parallel_buffers[0], a)
    assert len(dense_a) > 0 and len(expert_a) > 0 and sorted(dense_a + expert_a) == all_a, (
        "the MoE chunk must have two buffers splitting its layers"
    )
    before = {"a": w.weights(a), "b": w.weights(b)}

    a.buffers[0].offload_to_cpu(move_params=False)  # grads only: weights stay, caches stay
    assert [cached(a) == all_a, cached(b) == all_b, shim.stats()["calls"]] == [True, True, 0], (
        "move_params=False must clear nothing"
    )
    a.buffers[0].reload_from_cpu(move_params=False)

    a.buffers[0].offload_to_cpu()  # params move: exactly the dense layers of a
    assert [cached(a) == expert_a, cached(b) == all_b, shim.stats()["entries"] == len(dense_a)] == [True] * 3, (
        "only the layers whose weights are in the offloaded buffer"
    )
    a.expert_parallel_buffers[0].offload_to_cpu(move_params=True, move_grads=False)
    assert [cached(a), cached(b) == all_b, shim.stats()["entries"] == len(all_a)] == [[], True, True]
    b.buffers[0].offload_to_cpu(True, True)  # positional move_params
    assert cached(b) == []
    reload(a)
    reload(b)
    assert [w.same_weights(before["a"], w.weights(a)), w.same_weights(before["b"], w.weights(b))] == [True, True], (
        "weights must come back bit-identical after reload_from_cpu"
    )

    c = w.wrap_ddp(w.build_gpt())  # a DDP built after the shim was activated
    w.attach_fp8_caches(c)
    all_c = cached(c)
    c.buffers[0].offload_to_cpu()
    c.buffers[0].offload_to_cpu()  # again: a known buffer, no second search
    assert len(all_c) > 0 and cached(c) == [], "a DDP built after activation is found too"
    assert len(scans) == 2, "one search for the DDPs built before, one for the DDP built after, then none"
    s = shim.stats()
    assert s["calls"] == s["by_target"]["megatron-core"]["calls"] == 5
    assert s["entries"] == len(all_a) + len(all_b) + len(all_c)
    assert {r.target for r in _registry.records("target")} == {"megatron-core"}
    assert [_patch.shim_layers(DDP.__init__), _patch.shim_layers(DDP.forward)] == [0, 0], "nothing per training step"
    state = {t["name"]: t["state"] for t in shim.status()["targets"]}
    assert state["megatron-core"] == "patched"
    c_ref = weakref.ref(c)
    del c
    gc.collect()
    assert c_ref() is None, "the shim must not keep a DDP alive"


@pytest.mark.parametrize("release", [pytest.param(r, marks=on_release(r)) for r in (VENV_RELEASE, OTHER_RELEASE)])
def test_buffer_offload_clears_exactly_its_layers(release: str) -> None:
    """megatron imported and DDPs built before `import te_offload_shim` (patched at once)."""
    from harness import megatron_world as w

    a = moe_chunk()
    b = w.wrap_ddp(w.build_gpt())
    assert "te_offload_shim" not in sys.modules
    scenario(a, b, release)


@on_release(OTHER_RELEASE)
def test_buffer_offload_with_shim_imported_first() -> None:
    """`import te_offload_shim` first: the import hook patches param_and_grad_buffer when megatron loads."""
    import te_offload_shim  # noqa: F401

    assert "megatron" not in sys.modules
    from harness import megatron_world as w

    a = moe_chunk()
    b = w.wrap_ddp(w.build_gpt())
    scenario(a, b, OTHER_RELEASE)


@on_release(WITHOUT_METHOD)
def test_release_without_the_method_is_absent_not_an_error(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim as shim  # first: the watcher sees megatron's import

    pgb = importlib.import_module("megatron.core.distributed.param_and_grad_buffer")
    from megatron.core import package_info

    row = next(t for t in shim.status()["targets"] if t["name"] == "megatron-core")
    assert package_info.__version__ == WITHOUT_METHOD and not hasattr(pgb._ParamAndGradBuffer, "offload_to_cpu")
    assert row["state"] == "absent" and row["layers"] == 0
    assert shim.status()["hook_errors"] == [] and "Traceback" not in capfd.readouterr().err + caplog.text
