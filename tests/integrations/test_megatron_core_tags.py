"""megatron-core 0.17 - 0.19, which the package index here does not serve (it stops at 0.16.1): the
buffer offload target and its DDP owner search against a mirror of each tag's
`param_and_grad_buffer.py` / `distributed_data_parallel.py` (tests/mirrors/megatron_core_v0_17_v0_19,
citing NVIDIA/Megatron-LM core_v0.17.0 9539a12e, core_v0.18.0 ba7b5ebc, core_v0.19.0 5be96267).

What changed in those tags for the shim: `_ParamAndGradBuffer` is built from `(param, name)` pairs, the
DDP's buffer lists are filled one buffer at a time (0.18 on), and the buffer gained `extra_main_grads`
(FP32 `main_grad` copies), which `offload_to_cpu` (the same text from 0.16.1 to 0.19.0) leaves in place:
the residue report names them. Everything goes through the public behaviour: an offload through the
patched method clears the caches of exactly the TE layers whose weights live in that buffer. Each case
runs in a fresh interpreter with the mirror's `megatron` first on the path.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import mirror_env

ROOT = "megatron_core_v0_17_v0_19"
TAGS = ("0.17.0", "0.18.0", "0.19.0")
F32 = 4


def on_tag(tag: str) -> Any:
    return pytest.mark.subprocess(env={**mirror_env(ROOT), "MEGATRON_CORE_MIRROR_RELEASE": tag})


def tagged(test: Any) -> Any:
    return pytest.mark.parametrize("tag", [pytest.param(t, marks=on_tag(t)) for t in TAGS])(test)


def model(experts: bool = False) -> Any:
    """Linears in megatron's layer classes' names (what TE's layers replace), with TE-layout caches
    attached after the DDP maps their weights into its buffers; expert weights `allreduce=False`."""
    import torch

    class ColumnParallelLinear(torch.nn.Linear):
        pass

    class RowParallelLinear(torch.nn.Linear):
        pass

    m = torch.nn.Module()
    m.qkv = ColumnParallelLinear(16, 48)
    m.proj = RowParallelLinear(16, 16)
    if experts:
        m.expert0 = ColumnParallelLinear(16, 32)
        m.expert1 = RowParallelLinear(32, 16)
        for p in (*m.expert0.parameters(), *m.expert1.parameters()):
            p.allreduce = False  # type: ignore[attr-defined]  # megatron's attribute on a parameter
    m.norm = torch.nn.LayerNorm(16)
    return m


def ddp(module: Any, **config: Any) -> Any:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, **config)
    return DistributedDataParallel(None, ddp_config, module)


def cached(chunk: Any) -> list[str]:
    return sorted(n for n, m in chunk.named_modules() if m.__dict__.get("_fp8_workspaces"))


def the_tag(tag: str) -> None:
    from megatron.core import package_info
    from megatron.core.distributed import distributed_data_parallel

    assert package_info.TAG == tag and ROOT in str(distributed_data_parallel.__file__), "the mirror of that tag"


def scenario(a: Any, b: Any) -> None:
    """a: dense and expert buffers; b: dense only; c is built in here, after the shim."""
    import te_offload_shim as shim
    from harness import megatron_world as w

    for chunk in (a, b):
        w.attach_fp8_caches(chunk)
    all_a, all_b = cached(a), cached(b)
    assert len(a.buffers) == len(a.expert_parallel_buffers) == 1 and len(all_a) == 4
    before = {"a": w.weights(a), "b": w.weights(b)}

    a.offload_grad_buffers()  # grads only, each buffer with move_params=False: two calls left alone
    assert [cached(a), cached(b), shim.stats()["calls"]] == [all_a, all_b, 0], "move_params=False clears nothing"
    assert shim.stats()["left_alone"] == {"megatron-core": {"move_params=False: the weights stay on the device": 2}}
    for buffer in a.buffers + a.expert_parallel_buffers:
        buffer.reload_from_cpu(move_params=False)

    a.buffers[0].offload_to_cpu()
    assert cached(a) == ["module.expert0", "module.expert1"] and cached(b) == all_b, "only the dense buffer's layers"
    a.expert_parallel_buffers[0].offload_to_cpu(move_params=True, move_grads=False)
    b.buffers[0].offload_to_cpu(True, True)
    assert [cached(a), cached(b)] == [[], []]
    for chunk in (a, b):
        for buffer in chunk.buffers + chunk.expert_parallel_buffers:
            buffer.reload_from_cpu()
    assert w.same_weights(before["a"], w.weights(a)) and w.same_weights(before["b"], w.weights(b))

    c = ddp(model())  # a DDP built after the shim was active
    w.attach_fp8_caches(c)
    c.buffers[0].offload_to_cpu()
    assert cached(c) == []
    s = shim.stats()
    assert s["by_target"]["megatron-core"]["calls"] == s["calls"] == 4
    assert s["entries"] == len(all_a) + len(all_b) + 2
    assert {t["name"]: t["state"] for t in shim.status()["targets"]}["megatron-core"] == "patched"


@tagged
def test_buffer_offload_clears_its_layers_ddp_built_before_the_shim(tag: str) -> None:
    from harness import megatron_world as w

    w.apply_cpu_quirks()
    the_tag(tag)
    a, b = ddp(model(experts=True)), ddp(model())
    import te_offload_shim  # noqa: F401  (after: megatron's module is patched at once)

    scenario(a, b)


@tagged
def test_buffer_offload_clears_its_layers_shim_imported_first(tag: str) -> None:
    import sys

    import te_offload_shim  # noqa: F401  (first: the import hook patches the buffer's module)
    from harness import megatron_world as w

    assert "megatron" not in sys.modules
    w.apply_cpu_quirks()
    the_tag(tag)
    scenario(ddp(model(experts=True)), ddp(model()))


@tagged
def test_extra_main_grads_stay_after_the_offload_and_are_named(tag: str) -> None:
    """`param_name_patterns_for_fp32_local_accumulation` gives the matched parameters an FP32 `main_grad`
    outside the grad buffer (`_ParamAndGradBuffer.extra_main_grads`); the buffer offload frees the param
    and grad buffers but not those, and the residue report names them with their bytes."""
    import te_offload_shim as shim
    from harness import megatron_world as w

    w.apply_cpu_quirks()
    the_tag(tag)
    chunk = ddp(model(), param_name_patterns_for_fp32_local_accumulation=("qkv.*",))
    plain = ddp(model())
    w.attach_fp8_caches(chunk)
    expected = (48 * 16 + 48) * F32  # qkv's weight and bias, in float32 copies of their own
    assert len(chunk.buffers[0].extra_main_grads) == 2 and plain.buffers[0].extra_main_grads == []
    for buffer in chunk.buffers + plain.buffers:
        buffer.offload_to_cpu()
    report = shim.residue([chunk, plain], device_type="cpu")
    assert report.errors == [] and cached(chunk) == []
    assert report.named == {"extra_main_grads": expected}
    cpu_copies = 2 * (48 * 16 + 48 + 16 * 16 + 16 + 2 * 16) * F32  # each buffer's `param_data_cpu`, on the CPU here
    assert report.by_category["ddp_buffers"] == expected + cpu_copies, "param_data, grad_data freed; these not"
    assert "extra_main_grads 3.19 KiB" in report.summary()
    assert shim.residue([plain], device_type="cpu").named == {}, "named only where a buffer holds any"


@pytest.mark.parametrize("version", ["0.17.0rc0", "0.18.0", "0.19.1"])
def test_each_tags_own_version_is_a_supported_release(version: str) -> None:
    """What each tag's package_info says (core_v0.17.0 says 0.17.0rc0, core_v0.19.0 says 0.19.1)."""
    from te_offload_shim.integrations.targets import BUILTIN
    from te_offload_shim.integrations.versions import in_supported

    (row,) = [t for t in BUILTIN if t.name == "megatron-core"]
    assert in_supported(row, version)[0] is True
