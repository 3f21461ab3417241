"""Megatron's own offload, `_ParamAndGradBuffer.offload_to_cpu`, on real megatron-core releases.

Real `GPTModel`s wrapped in real megatron DDP (harness/megatron_world.py), TE-layout caches on their
linears. One chunk is a MoE model whose expert weights get a buffer of their own, so "the layers in
that buffer" is a strict subset of the chunk. Each case runs in a fresh interpreter with the chosen
megatron-core release first on the path (0.16.1 is the venv's, 0.16.0 and 0.15.3 are --no-deps folders).
"""

from __future__ import annotations

import os

import pytest
from conftest import DEPS, REPO, run_py

VENV_RELEASE = "0.16.1"
OTHER_RELEASE = "0.16.0"
WITHOUT_METHOD = "0.15.3"  # every PyPI release before 0.16.0 lacks offload_to_cpu


def megatron_env(release: str) -> dict[str, str]:
    """PYTHONPATH putting `release` first (the venv's megatron-core is the fallback)."""
    paths = [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    if release != VENV_RELEASE:
        folder = DEPS / f"megatron-core-{release}"
        if not (folder / "megatron").is_dir():
            pytest.skip(f"megatron-core {release} not installed in {folder} (run scripts/setup-env.sh)")
        paths.append(str(folder))
    paths.append(str(REPO))
    return {"PYTHONPATH": os.pathsep.join(paths)}


WORLD = """
import gc, weakref, torch
from harness import megatron_world as w
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core import package_info

def moe_chunk():
    w.init_world()
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                            bf16=False, params_dtype=torch.float32, num_moe_experts=2, moe_router_topk=2,
                            ffn_hidden_size=128)
    model = GPTModel(cfg, get_gpt_layer_local_spec(num_experts=2), vocab_size=128, max_sequence_length=32)
    # With expert parallelism megatron marks expert weights allreduce=False (experts.py, TE layers);
    # DDP then keeps them in expert_parallel_buffers, apart from the dense weights.
    for name, p in model.named_parameters():
        if ".experts." in name:
            p.allreduce = False
    return w.wrap_ddp(model)

def cached(ddp):
    return sorted(n for n, m in ddp.named_modules() if m.__dict__.get("_fp8_workspaces"))

def layers_in(buffer, ddp):
    ids = {id(p) for p in buffer.params}
    return sorted(n for n, m in w.linear_layers(ddp) if any(id(p) in ids for p in m.parameters(recurse=False)))

def reload(ddp):
    for b in ddp.buffers + ddp.expert_parallel_buffers:
        b.reload_from_cpu()
"""

# Chunks a (MoE: dense + expert buffer) and b (dense) exist when this runs; c is built after it.
SCENARIO = """
import te_offload_shim as shim
from te_offload_shim.integrations import megatron as megatron_buffers
from te_offload_shim.engine import patch as _patch
from te_offload_shim.engine import registry as _registry
from megatron.core.distributed import DistributedDataParallel as DDP
scans = []
real_scan = megatron_buffers._scan
megatron_buffers._scan = lambda: (scans.append(1), real_scan())[1]
out = {"version": package_info.__version__}
for ddp in (a, b):
    w.attach_fp8_caches(ddp)
all_a, all_b = cached(a), cached(b)
dense_a, expert_a = layers_in(a.buffers[0], a), layers_in(a.expert_parallel_buffers[0], a)
out["partition"] = [len(dense_a), len(expert_a), sorted(dense_a + expert_a) == all_a]
before = {"a": w.weights(a), "b": w.weights(b)}

a.buffers[0].offload_to_cpu(move_params=False)   # grads only: weights stay, caches stay
out["grads_only"] = [cached(a) == all_a, cached(b) == all_b, shim.stats()["calls"]]
a.buffers[0].reload_from_cpu(move_params=False)

a.buffers[0].offload_to_cpu()                    # params move: exactly the dense layers of a
out["dense"] = [cached(a) == expert_a, cached(b) == all_b, shim.stats()["entries"] == len(dense_a)]
a.expert_parallel_buffers[0].offload_to_cpu(move_params=True, move_grads=False)
out["expert"] = [cached(a), cached(b) == all_b, shim.stats()["entries"] == len(all_a)]
b.buffers[0].offload_to_cpu(True, True)          # positional move_params
out["b"] = cached(b)
reload(a); reload(b)
out["same"] = [w.same_weights(before["a"], w.weights(a)), w.same_weights(before["b"], w.weights(b))]

c = w.wrap_ddp(w.build_gpt())                    # a DDP built after the shim was activated
w.attach_fp8_caches(c)
all_c = cached(c)
c.buffers[0].offload_to_cpu()
c.buffers[0].offload_to_cpu()                    # again: a known buffer, no second search
out["c"] = [len(all_c), cached(c)]
out["scans"] = len(scans)
s = shim.stats()
out["stats"] = [s["calls"], s["by_target"]["megatron-core"]["calls"], s["entries"]]
out["expected_entries"] = len(all_a) + len(all_b) + len(all_c)
out["wrapped"] = sorted({r.target for r in _registry.records("target")})
out["untouched"] = [_patch.shim_layers(DDP.__init__), _patch.shim_layers(DDP.forward)]
state = {t["name"]: t["state"] for t in shim.status()["targets"]}
out["state"] = state["megatron-core"]
c_ref = weakref.ref(c)
del c
gc.collect()
out["c_freed"] = c_ref() is None
emit(**out)
"""


def _check(r: dict, release: str) -> None:
    assert r["version"] == release
    n_dense, n_expert, partition = r["partition"]
    assert n_dense > 0 and n_expert > 0 and partition, "the MoE chunk must have two buffers splitting its layers"
    assert r["grads_only"] == [True, True, 0], "move_params=False must clear nothing"
    assert r["dense"] == [True, True, True], "only the layers whose weights are in the offloaded buffer"
    assert r["expert"] == [[], True, True]
    assert r["b"] == []
    assert r["same"] == [True, True], "weights must come back bit-identical after reload_from_cpu"
    assert r["c"][0] > 0 and r["c"][1] == [], "a DDP built after activation is found too"
    assert r["scans"] == 2, "one search for the DDPs built before, one for the DDP built after, then none"
    assert r["stats"][0] == r["stats"][1] == 5 and r["stats"][2] == r["expected_entries"]
    assert r["wrapped"] == ["megatron-core"] and r["untouched"] == [0, 0], "nothing per training step"
    assert r["state"] == "patched"
    assert r["c_freed"], "the shim must not keep a DDP alive"


@pytest.mark.parametrize("release", [VENV_RELEASE, OTHER_RELEASE])
def test_buffer_offload_clears_exactly_its_layers(release: str) -> None:
    """megatron imported and DDPs built before `import te_offload_shim` (patched at once)."""
    code = WORLD + "a = moe_chunk()\nb = w.wrap_ddp(w.build_gpt())\nassert 'te_offload_shim' not in sys.modules\n"
    r = run_py(code + SCENARIO, env=megatron_env(release))
    _check(r, release)


def test_buffer_offload_with_shim_imported_first() -> None:
    """`import te_offload_shim` first: the import hook patches param_and_grad_buffer when megatron loads."""
    code = "import te_offload_shim\nassert 'megatron' not in sys.modules\n" + WORLD
    code += "a = moe_chunk()\nb = w.wrap_ddp(w.build_gpt())\n"
    r = run_py(code + SCENARIO, env=megatron_env(OTHER_RELEASE))
    _check(r, OTHER_RELEASE)


def test_release_without_the_method_is_absent_not_an_error() -> None:
    code = """
import te_offload_shim as shim
import megatron.core.distributed.param_and_grad_buffer as pgb
from megatron.core import package_info
row = [t for t in shim.status()["targets"] if t["name"] == "megatron-core"][0]
emit(version=package_info.__version__, has=hasattr(pgb._ParamAndGradBuffer, "offload_to_cpu"),
     state=row["state"], layers=row["layers"], hook_errors=shim.status()["hook_errors"])
"""
    r = run_py(code, env=megatron_env(WITHOUT_METHOD))
    assert r["version"] == WITHOUT_METHOD and r["has"] is False
    assert r["state"] == "absent" and r["layers"] == 0
    assert r["hook_errors"] == [] and "Traceback" not in r["_stderr"]
