"""The allocator-flush net on TE's own code (the CPU twin), with no row of the target table in play.

A real megatron-core `GPTModel` from `get_gpt_layer_with_transformer_engine_spec()` (TE 2.20.2's own
LayerNormLinear, Linear and DotProductAttention on the twin, harness/gpt_on_twin.py), trained through
Megatron's schedule, is offloaded after each step by code no row knows, each ending in
`torch.cuda.empty_cache()`:
(a) AReaL's current `MegatronColocateBackend.release_memory` (tests/mirrors/areal/engine/weight_update/
    awex/megatron.py): DDP buffers through megatron-core's `offload_to_cpu()`, and for a chunk without
    DDP each parameter swapped for `torch.empty(0, device="cpu")`;
(b) SkyRL's newest `offload_megatron_model_to_cpu(models, is_lora)` under a fork's module name
    (tests/mirrors/forks/skyrl_megatron_utils.py), `is_lora=False` (the buffers) and `True` (the
    frozen base weights swapped for zero-byte tensors still on CUDA, the buffers left resident);
(c) the real verl 0.8.0 `offload_megatron_model_to_cpu`, its file loaded under another module name (a
    fork's copy: the `verl` row watches `verl.utils.megatron_utils` only);
(d) megatron-core's real `_ParamAndGradBuffer.offload_to_cpu` then a flush.
`TE_OFFLOAD_SHIM_DISABLE=*` takes every row out of play (the megatron-core row included) and nothing
is declared: only the net can clear. Each run is done twice in one interpreter, the net off
(`TE_OFFLOAD_SHIM_NET=0`, read at every flush) and on, and compared to the bit.

On the twin every tensor is of the device type (the twin's `is_cuda` is True for its CPU tensors)
but what an offload run under `host.offloading()` moves to the host (harness/te_twin/host.py), which
answers as a host tensor does on a GPU. So both kinds of "off" are shown: a storage resized to zero
bytes under the parameter's shape (the DDP buffers' offload) or an empty swap the offload marks
(SkyRL's LoRA), on the device type; and each weight moved to the host (AReaL's
`torch.empty(0, device="cpu")` swap of a chunk without DDP, verl's `param.data.to("cpu")` of a
reference chunk, ChatLearn's two releases). Outside that scope an empty CPU swap is an empty tensor
on the device, which the rule keeps as it keeps a sharding wrapper's reshard. The reshards
themselves: DeepSpeed ZeRO-3 (real 0.19.8) and a wrapper that leaves no mark, between microbatches,
clear nothing. The flushes are observed by a recorder the net wraps (put in place of the twin's
no-op before TE is imported): the net runs first, and the caller it names is the offload's own.

One release and one recipe (TE 2.20.2, delayed scaling: the recipe under which a cache dropped
mid-step would change the numbers); about 35 s of CPU in all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from support.set_up import needs

REPO = Path(__file__).resolve().parents[2]
VERL = "0.8.0"
RELEASE, FP8 = "2.20.2", "hybrid"
LAYERS, LINEARS_PER_LAYER = 2, 4  # linear_qkv, linear_proj, linear_fc1, linear_fc2: 8 caches
ENTRIES = LAYERS * LINEARS_PER_LAYER
FORK = "forks.verl_megatron_utils"  # the module name verl 0.8.0's file is loaded under
NO_ROWS = {"TE_OFFLOAD_SHIM_DISABLE": "*", "TE_OFFLOAD_SHIM_STRICT": "1"}
twin = pytest.mark.subprocess(verl=VERL, env=NO_ROWS, timeout=300)


_WATCHED: list[Any] = []  # the model chunks whose caches the flush recorder counts
_SEEN: list[int] = []  # TE FP8 caches left in them after each flush


def _start() -> ModuleType:
    """The shim imported before TE (as its start-up hook would be), then TE on the twin: the net arms
    when TE's base module is imported and wraps the flush torch.cuda holds then, here a recorder put
    in place of the twin's no-op, so the net runs first, the recorder sees what it left and the net
    sees the real caller. The mirrors on the path. Returns the shim."""
    sys.path[:0] = [str(REPO / "tests" / "mirrors")]
    import torch
    import torch._dynamo  # te_twin.load imports it before the device answers change

    import te_offload_shim
    from harness import gpt_on_twin as gpt
    from harness.te_twin import device

    def recorder() -> None:  # not a module global: the net rebinds the globals that hold the flush it wraps
        if _WATCHED:
            _SEEN.append(gpt.te_float8_entries(_WATCHED))

    device.install(90)
    torch.cuda.empty_cache = recorder  # type: ignore[assignment]
    gpt.load(RELEASE)
    assert getattr(torch.cuda.empty_cache, "__wrapped__", None) is recorder, "the net wrapped the flush at TE's import"
    return te_offload_shim


@contextlib.contextmanager
def _net(on: bool) -> Iterator[None]:
    import os

    os.environ["TE_OFFLOAD_SHIM_NET"] = "1" if on else "0"
    try:
        yield
    finally:
        os.environ.pop("TE_OFFLOAD_SHIM_NET", None)


@contextlib.contextmanager
def _flushes(models: list[Any]) -> Iterator[list[int]]:
    """Inside: each `torch.cuda.empty_cache()` records how many TE FP8 caches `models` hold once
    the net (if on) has run."""
    _WATCHED[:] = models
    _SEEN.clear()
    try:
        yield _SEEN
    finally:
        _WATCHED.clear()


@dataclasses.dataclass
class Run:
    losses: list[Any] = dataclasses.field(default_factory=list)
    before: list[int] = dataclasses.field(default_factory=list)  # caches before each offload
    at_flush: list[int] = dataclasses.field(default_factory=list)  # caches left by the offload's flushes
    mid_step: list[int] = dataclasses.field(default_factory=list)  # ... by flushes between microbatches
    between_steps: list[int] = dataclasses.field(default_factory=list)  # ... by flushes after a step
    kernels: list[dict[str, int]] = dataclasses.field(default_factory=list)  # TE's calls per step
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)


def _offloads() -> list[tuple[str, Callable[[Any], None], Callable[[Any], None]]]:
    """(name, offload ending in a flush, reload) for the four paths no row knows, on a DDP chunk."""
    import torch
    from areal.engine.weight_update.awex.megatron import MegatronColocateBackend
    from forks import skyrl_megatron_utils as skyrl

    from harness.fork_copy import load_as

    fork = sys.modules.get(FORK) or load_as(REPO / ".deps" / f"verl-{VERL}" / "verl/utils/megatron_utils.py", FORK)
    backends: dict[int, Any] = {}

    def areal(ddp: Any) -> Any:
        return backends.setdefault(id(ddp), MegatronColocateBackend(SimpleNamespace(model=[ddp], device="cuda")))

    def areal_reload(ddp: Any) -> None:
        areal(ddp).resume_memory(["weights"])
        areal(ddp).ensure_grad_buffers()

    def megatron_offload(ddp: Any) -> None:
        for buffer in ddp.buffers:
            buffer.offload_to_cpu(move_params=True, move_grads=False)
        torch.cuda.empty_cache()

    def megatron_reload(ddp: Any) -> None:
        for buffer in ddp.buffers:
            buffer.reload_from_cpu(move_params=True, move_grads=False)

    return [
        ("areal", lambda ddp: areal(ddp).release_memory(["weights"]), areal_reload),
        ("skyrl", lambda ddp: skyrl.offload_to_cpu([ddp]), lambda ddp: skyrl.load_megatron_model_to_gpu([ddp])),
        (
            "verl-fork",
            lambda ddp: fork.offload_megatron_model_to_cpu([ddp]),
            lambda ddp: fork.load_megatron_model_to_gpu([ddp]),
        ),
        ("megatron-core", megatron_offload, megatron_reload),
    ]


def _train(on: bool, steps: int, **build: Any) -> Run:
    """`steps` steps of 2 microbatches, a flush between the microbatches and one after each step
    (weights on the device), then one offload path per step in turn, its reload."""
    import torch

    from harness import gpt_on_twin as gpt
    from harness.te_twin import counters

    paths = _offloads()
    run = Run()
    with _net(on):
        ddp = gpt.build(FP8, layers=LAYERS, **build)
        with _flushes([ddp]) as seen:
            for step in range(steps):
                with counters.counting():
                    run.losses += gpt.train_step(ddp, step, between=lambda i: torch.cuda.empty_cache())
                    run.kernels.append(dict(counters.calls))
                run.mid_step += seen[:]
                seen.clear()
                torch.cuda.empty_cache()
                run.between_steps += seen[:]
                seen.clear()
                run.before.append(gpt.te_float8_entries([ddp]))
                _, offload, reload = paths[step % len(paths)]
                offload(ddp)
                run.at_flush.append(seen[-1])  # at the offload's own (last) flush
                seen.clear()
                reload(ddp)
                seen.clear()
        run.weights = gpt.weights(ddp)
    return run


def _same(a: Run, b: Run) -> None:
    from harness import gpt_on_twin as gpt

    assert len(a.losses) == len(b.losses) > 0
    assert all(gpt.same_bits(x, y) for x, y in zip(a.losses, b.losses, strict=True)), (a.losses, b.losses)
    assert a.weights.keys() == b.weights.keys() and len(a.weights) > 20
    differ = [name for name in a.weights if not gpt.same_bits(a.weights[name], b.weights[name])]
    assert not differ, differ


@twin
def test_four_offloads_no_row_knows_are_cleared_at_their_flush_bit_identical_to_the_net_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """AReaL's colocate release, SkyRL's newest offload under a fork's name, verl 0.8.0's function
    under another module name, megatron-core's buffer offload + flush: 8 caches at each flush with
    the net off, 0 with it on; every loss and weight bit-identical; the caches rebuilt every step;
    flushes between microbatches and between steps clear nothing; TE makes the same kernel calls;
    the one first-clearing line names AReaL's release as the flush's caller."""
    caplog.set_level(logging.INFO, logger="te_offload_shim")
    shim = _start()
    steps = 4
    off = _train(False, steps)
    assert shim.stats()["net"]["cleared_flushes"] == 0, "the net off clears nothing"
    on = _train(True, steps)

    for run in (off, on):
        assert run.before == [ENTRIES] * steps, "TE's forward makes one FP8 cache per linear, every step"
        assert run.mid_step == [ENTRIES] * steps, "a flush between microbatches clears nothing"
        assert run.between_steps == [ENTRIES] * steps, "a flush after a step, weights on the device, clears nothing"
    assert off.at_flush == [ENTRIES] * steps, "with no row in play and the net off, every path leaks its caches"
    assert on.at_flush == [0] * steps, "the net clears them at the path's own flush"
    _same(off, on)
    assert off.kernels == on.kernels and sum(off.kernels[0].values()) > 0, "the same TE kernel calls, step by step"

    net = shim.stats()["net"]
    assert net["cleared_flushes"] == steps and net["entries"] == ENTRIES * steps and net["bytes"] > 0, net
    assert shim.stats()["calls"] == 0, "no table row cleared anything"
    row = shim.status()["net"]
    assert row["state"] == "armed" and row["layers"] >= ENTRIES * steps, row
    callers = " ".join(row["callers"])
    for where in ("megatron.py", "skyrl_megatron_utils.py", "megatron_utils.py", "test_twin_net.py"):
        assert where in callers, (where, row["callers"])
    assert "verl.utils.megatron_utils" not in sys.modules, "verl's own module (the row's) was never imported"
    lines = [r.getMessage() for r in caplog.records if "the target table does not know" in r.getMessage()]
    assert len(lines) == 1 and f"left {ENTRIES} FP8 weight caches" in lines[0], lines
    assert "awex/megatron.py:" in lines[0] and "in release_memory" in lines[0], lines


def _resized_away(t: Any) -> Any:
    """A tensor of `t`'s shape whose storage was resized to zero bytes (megatron-core's buffer offload)."""
    import torch

    gone = torch.empty_like(t)
    gone.untyped_storage().resize_(0)
    return gone


@twin
def test_skyrl_lora_offload_is_cleared_and_a_layer_half_on_the_device_is_not() -> None:
    """SkyRL's `is_lora=True` (the buffers stay, the frozen TE weights become zero-byte tensors on
    CUDA): 0 caches at its flush, training bit-identical to the net off. A layer with one weight left
    on the device keeps its cache while the layer beside it, wholly off, loses its own in the same flush."""
    shim = _start()
    import torch
    from forks import skyrl_megatron_utils as skyrl

    from harness import gpt_on_twin as gpt

    def lora(on: bool) -> Run:
        run = Run()
        with _net(on):
            ddp = gpt.build(FP8, layers=LAYERS, frozen=lambda name: ".linear_" in name)
            assert all(not p.requires_grad for n, p in ddp.named_parameters() if ".linear_" in n)
            with _flushes([ddp]) as seen:
                for step in range(2):
                    run.losses += gpt.train_step(ddp, step)
                    run.before.append(gpt.te_float8_entries([ddp]))
                    skyrl.offload_to_cpu([ddp], is_lora=True)
                    assert all(b.param_data.untyped_storage().size() > 0 for b in ddp.buffers), "buffers stay"
                    run.at_flush += seen
                    seen.clear()
                    skyrl.load_megatron_model_to_gpu([ddp], is_lora=True)
            run.weights = gpt.weights(ddp)
        return run

    off, on = lora(False), lora(True)
    assert off.before == on.before == [ENTRIES] * 2
    assert off.at_flush == [ENTRIES] * 2 and on.at_flush == [0] * 2
    _same(off, on)

    with _net(True):
        ref = gpt.build(FP8, layers=LAYERS, wrap=False)
        with _flushes([ref]) as seen:
            gpt.train_step(ref, 1, forward_only=True)
            layer = ref.decoder.layers[0].mlp
            half, whole = layer.linear_fc1, layer.linear_fc2  # LayerNormLinear, Linear
            kept = half.weight.data
            half.weight.data = _resized_away(kept)  # its layer-norm weight stays on the device
            for param in whole.parameters():
                param.data = _resized_away(param.data)
            torch.cuda.empty_cache()
            assert seen == [ENTRIES - 1], "only the layer wholly off the device was cleared"
            assert half.__dict__["_fp8_workspaces"] and not whole.__dict__["_fp8_workspaces"]
            half.weight.data = kept
    assert shim.stats()["calls"] == 0, "no table row cleared anything"


def _host_offloads() -> list[tuple[str, Callable[[Any], None], Callable[[Any], None]]]:
    """(name, offload ending in a flush, reload) for the paths that move each weight of a chunk
    without DDP (a reference model) to the host; the offload runs under the twin's host scope."""
    import torch
    from areal.engine.weight_update.awex.megatron import MegatronColocateBackend
    from chatlearn.models.megatron.memory_manager.inference import InferenceMemoryManager

    from harness.fork_copy import load_as
    from harness.te_twin import host

    fork = sys.modules.get(FORK) or load_as(REPO / ".deps" / f"verl-{VERL}" / "verl/utils/megatron_utils.py", FORK)
    backends: dict[int, Any] = {}

    def areal(ref: Any) -> Any:
        return backends.setdefault(id(ref), MegatronColocateBackend(SimpleNamespace(model=[ref], device="cuda")))

    def areal_offload(ref: Any) -> None:
        with host.offloading():
            areal(ref).release_memory(["weights"])

    def verl_offload(ref: Any) -> None:
        with host.offloading():
            fork.offload_megatron_model_to_cpu([ref])

    def chatlearn_offload(ref: Any) -> None:
        with host.offloading():
            InferenceMemoryManager([ref]).offload_weights()
            torch.cuda.empty_cache()  # its caller's flush (TorchModule.offload)

    def chatlearn_reload(ref: Any) -> None:  # the mirror has no onload: each weight back to the device
        for p in ref.parameters():
            p.data = p.data.to("cuda", non_blocking=True)

    return [
        ("areal", areal_offload, lambda ref: areal(ref).resume_memory(["weights"])),
        ("verl-fork", verl_offload, lambda ref: fork.load_megatron_model_to_gpu([ref])),
        ("chatlearn-inference", chatlearn_offload, chatlearn_reload),
    ]


@twin
def test_offloads_that_move_each_weight_to_the_host_are_cleared_at_their_flush_bit_identical_to_the_net_off() -> None:
    """The most common offload in the field moves each weight to the host, where on a GPU it is off
    the device type; on the twin it answers so when the offload's own code moved it there
    (`host.offloading()`, harness/te_twin/host.py). A trained DDP chunk: ChatLearn's trainer
    release (its flat buffers copied to a CPU store and resized away, every parameter's data
    `torch.Tensor()`), its caller's flush, its reload, 3 steps. A reference chunk without DDP,
    forward only, one path per step: AReaL's release (`torch.empty(0, device="cpu")`), verl 0.8.0's
    real function under a fork's module name (`param.data = param.data.to("cpu")`), ChatLearn's
    inference release (`p.data.to("cpu", copy=True)`) then a flush. Net off: 8 caches at every
    flush; on: 0; every loss and weight bit-identical, the caches rebuilt. The control: AReaL's
    release outside the scope (every CPU tensor the twin's device) is an empty swap on the device,
    kept as a reshard is."""
    shim = _start()
    import torch
    from chatlearn.models.megatron.memory_manager.trainer import TrainerMemoryManager

    from harness import gpt_on_twin as gpt
    from harness.te_twin import host

    steps = 3

    def trained(on: bool) -> Run:
        run = Run()
        with _net(on):
            ddp = gpt.build(FP8, layers=LAYERS)
            manager = TrainerMemoryManager([ddp])
            with _flushes([ddp]) as seen:
                for step in range(steps):
                    run.losses += gpt.train_step(ddp, step)
                    run.before.append(gpt.te_float8_entries([ddp]))
                    with host.offloading():
                        manager.offload_weights()
                        torch.cuda.empty_cache()  # its caller's flush (TorchModule.offload)
                    assert not any(p.is_cuda for p in ddp.parameters()), "every weight on the host"
                    run.at_flush += seen
                    seen.clear()
                    manager.onload_weights()
                    assert all(p.is_cuda and p.numel() for p in ddp.parameters()), "every weight back"
            run.weights = gpt.weights(ddp)
        return run

    def reference(on: bool) -> Run:
        run = Run()
        paths = _host_offloads()
        with _net(on):
            ref = gpt.build(FP8, layers=LAYERS, wrap=False)
            with _flushes([ref]) as seen:
                for step, (_, offload, reload) in enumerate(paths):
                    run.losses += gpt.train_step(ref, step, forward_only=True)
                    run.before.append(gpt.te_float8_entries([ref]))
                    offload(ref)
                    run.at_flush.append(seen[-1])  # at the offload's own (last) flush
                    seen.clear()
                    reload(ref)
                    assert all(p.is_cuda for p in ref.parameters()), "every weight back"
                run.losses += gpt.train_step(ref, len(paths), forward_only=True)
            run.weights = gpt.weights(SimpleNamespace(module=ref))
        return run

    for off, on, count in ((trained(False), trained(True), steps), (reference(False), reference(True), 3)):
        assert off.before == on.before == [ENTRIES] * count, "TE's forward makes (again) one FP8 cache per linear"
        assert off.at_flush == [ENTRIES] * count, "the net off: every path leaks its caches"
        assert on.at_flush == [0] * count, "the net clears them at the path's own flush"
        _same(off, on)
    assert shim.stats()["calls"] == 0, "no table row cleared anything"
    assert shim.stats()["net"]["cleared_flushes"] == 2 * 3, shim.stats()["net"]

    from areal.engine.weight_update.awex.megatron import MegatronColocateBackend

    with _net(True):
        ref = gpt.build(FP8, layers=LAYERS, wrap=False)
        backend = MegatronColocateBackend(SimpleNamespace(model=[ref], device="cuda"))
        with _flushes([ref]) as seen:
            gpt.train_step(ref, 0, forward_only=True)
            backend.release_memory(["weights"])
            assert seen == [ENTRIES], "outside the host scope the CPU swap is an empty tensor on the device: kept"
            assert all(p.is_cuda and p.numel() == 0 for p in ref.parameters())
            backend.resume_memory(["weights"])


DEEPSPEED = REPO / ".deps" / "deepspeed-0.19.8"  # scripts/setup-env.sh: its PyPI sdist, --no-deps
ZERO3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
ONE_RANK = {"DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}


def _zero3() -> Any:
    """Real DeepSpeed 0.19.8 on the CPU (its CPU accelerator), one rank over gloo. Its C++
    shared-memory all-reduce is compiled at the first `init_distributed` (about two minutes here) and
    a world of one never calls it: it is marked not compatible, DeepSpeed's own path where it cannot
    build (deepspeed/comm/torch.py `build_shm_op` then returns None)."""
    needs(DEEPSPEED / "deepspeed", f"DeepSpeed 0.19.8 not installed in {DEEPSPEED.relative_to(REPO)}")
    sys.path.insert(0, str(DEEPSPEED))
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    import deepspeed
    from deepspeed.ops.op_builder import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    return deepspeed


@pytest.mark.subprocess(env={**NO_ROWS, **ONE_RANK}, timeout=300)
@pytest.mark.parametrize("reshard", ["deepspeed-zero3", "unmarked"])
def test_a_reshard_between_microbatches_is_never_taken_for_an_offload_bit_identical_to_the_net_off(
    reshard: str,
) -> None:
    """A bias-free TE projection whose one weight a sharding wrapper frees after each use: real
    DeepSpeed ZeRO-3 (`zero.Init` partitions it; leaving `GatheredParameters`, as after each
    submodule's use, runs `free_param`: `param.data = torch.empty(0, dtype, device=param.device)`
    with `ds_shape` keeping the real shape), or a wrapper that leaves no mark and frees the same
    way. Six microbatches under delayed scaling, `is_first_microbatch=False` after the first (TE
    reuses its cache), a flush between each: the net clears nothing (every weight is "off" by its
    bytes, none by the rule) and every loss, input gradient and the weight's gradient are the
    bits of the net off. On 0.6.0 the net cleared the cache at each flush: 5 of 6 losses moved."""
    shim = _start()
    import torch

    from harness import te_twin
    from harness.te_twin import training

    deepspeed = _zero3() if reshard == "deepspeed-zero3" else None
    te = training.te()

    kept: list[int] = []  # TE's caches left after each flush

    def run(on: bool) -> list[Any]:
        with _net(on):
            torch.manual_seed(0)
            layer = te.Linear(training.HIDDEN, training.HIDDEN, bias=False, params_dtype=torch.float32)
            weight, full = layer.weight, layer.weight.data
            if deepspeed is not None:
                deepspeed.zero.Init(module=layer, config_dict_or_path=ZERO3)
                assert tuple(weight.ds_shape) == (training.HIDDEN,) * 2, "partitioned: the shard is ds_tensor"
            else:
                weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)

            @contextlib.contextmanager
            def gathered() -> Iterator[None]:
                """The weight whole for one use: DeepSpeed's all-gather (its engine's pre-forward hook does
                the same), then its `free_param`; or the unmarked wrapper's same two steps."""
                if deepspeed is not None:
                    with deepspeed.zero.GatheredParameters([weight]):
                        yield
                    return
                weight.data = full
                yield
                weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)

            recipe = training.make_recipe("DelayedScaling")
            torch.manual_seed(1)
            out: list[Any] = []
            for microbatch in range(6):
                x = torch.randn(training.TOKENS, training.HIDDEN, requires_grad=True)
                with gathered():
                    with te_twin.autocast(recipe):
                        y = layer(x, is_first_microbatch=microbatch == 0)
                    loss = y.float().square().mean()
                    loss.backward()
                assert weight.numel() == 0, "freed again after its use"
                torch.cuda.empty_cache()  # a flush between microbatches
                kept.append(len(layer.__dict__["_fp8_workspaces"]))
                out += [loss.detach(), x.grad]
            return [*out, weight.grad]

    off, on = run(False), run(True)
    from harness import gpt_on_twin as gpt

    assert all(gpt.same_bits(a, b) for a, b in zip(off, on, strict=True)), [
        (a.item().hex(), b.item().hex()) for a, b in zip(off[:12:2], on[:12:2], strict=True)
    ]
    assert kept == [1] * 12, "the cache TE reuses is kept at every flush"
    net = shim.stats()["net"]
    assert net["flushes"] == 6 and net["cleared_flushes"] == 0, net  # the net off counts no flush
