"""Every entry of the target table, the way its framework calls it (one contract, one case per entry in
tests/support/entries.py), then what differs from entry to entry.

NeMo-RL, ROLL, slime/miles, SkyRL, RLinf, ChatLearn and Relax are not on PyPI or do not import on this
CPU-only set-up, and AReaL's modules do not import on a CPU-only machine (docs/frameworks.md, "Left out,
and why"): each mirror (tests/mirrors/) reproduces the real module path, class, signature and the lines
that matter, citing the upstream file and commit. verl, megatron-core and ms-swift are the real
packages. The models are real megatron-core DDP chunks (and plain chunks where the framework offloads
those) with TE-layout caches; the mirrors' flushes record what is still cached at that moment. Each
test runs in a fresh interpreter; this module imports nothing heavy at its top.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest
from conftest import DEPS, mirror_env, use_mirrors
from support.entries import CASES
from support.set_up import missing


def chunk() -> tuple[Any, int]:
    """A megatron DDP chunk with TE-layout caches, and how many entries they hold."""
    from harness import megatron_world as w

    m = w.wrap_ddp(w.build_gpt())
    return m, w.attach_fp8_caches(m)


def events() -> list:
    """The mirrors' flushes since the last call, as [kind, entries still cached]."""
    import mirror_flush

    got = [list(e) for e in mirror_flush.EVENTS]
    mirror_flush.EVENTS.clear()
    return got


def by_target() -> dict[str, list[int]]:
    import te_offload_shim as shim

    return {k: [v["calls"], v["entries"]] for k, v in shim.stats()["by_target"].items()}


def shim_stats() -> dict:
    import te_offload_shim as shim

    return dict(shim.stats())


def reset_stats() -> None:
    from te_offload_shim.engine import stats

    stats.reset()


def states() -> dict[str, str]:
    import te_offload_shim as shim

    return {t["name"]: t["state"] for t in shim.status()["targets"]}


@pytest.mark.subprocess()
def test_nemo_rl_0_6_layout_and_0_4_layout() -> None:
    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors()
    from nemo_rl.models.policy import megatron_policy_worker as old
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    from harness import megatron_world as w

    m, n = chunk()
    worker = mpw.MegatronPolicyWorkerImpl(m, {"megatron_cfg": {}})
    worker.offload_before_refit()
    assert events() == [["flush", 0]] and w.cache_state(m)["entries"] == 0, (
        "cleared before the method's own empty_cache"
    )
    assert by_target() == {"nemo-rl": [1, n]}, "the nested grad-buffer offload must not count a second call"
    reset_stats()

    # What the actor process instantiates: the @ray.remote class's modified class.
    actor_cls = mpw.MegatronPolicyWorker.__ray_metadata__.modified_class
    m2, _ = chunk()
    actor_cls(m2, {"megatron_cfg": {"fp8_cfg": {"force_clear_fp8_caches": True}}}).offload_before_refit()
    assert events() == [["flush", 0]] and by_target() == {}, "NeMo-RL clears itself: left alone"
    reason = "NeMo-RL fp8_cfg.force_clear_fp8_caches is on: it clears the caches itself"
    assert shim_stats()["left_alone"] == {"nemo-rl-0.5": {reason: 1}}, "the actor class runs the @ray.remote entry"
    m3, _ = chunk()
    actor_cls(m3, {"megatron_cfg": {"fp8_cfg": {"force_clear_fp8_caches": False}}}).offload_before_refit()
    assert [events(), sum(v[0] for v in by_target().values()), w.cache_state(m3)["entries"]] == [[["flush", 0]], 1, 0]
    reset_stats()

    # offload_after_refit (an entry of its own): Megatron's buffer offload (params move) runs inside it
    # first, then offload_before_refit; both find the chunk cleared by the outer call.
    m4, n4 = chunk()
    before4 = w.weights(m4)
    worker4 = mpw.MegatronPolicyWorkerImpl(m4, {"megatron_cfg": {}})
    worker4.offload_after_refit()
    assert events() == [["flush", 0]]
    assert by_target() == {"nemo-rl-after-refit": [1, n4]}
    worker4.move_model(worker4.model, "cuda")
    assert w.same_weights(before4, w.weights(m4))
    reset_stats()

    m5, n5 = chunk()
    old.MegatronPolicyWorker.__ray_metadata__.modified_class(m5, {"megatron_cfg": {}}).offload_before_refit()
    assert events() == [["flush", 0]] and by_target() == {"nemo-rl-0.3": [1, n5]}
    found = states()
    assert found["nemo-rl"] == found["nemo-rl-0.3"] == "patched"


def frozen_layer_chunk() -> tuple[Any, int, str]:
    """A DDP chunk one of whose linears is frozen: its weight is outside every DDP buffer, so megatron-core's
    buffer offload never clears that layer's cache (only a row that walks the whole model does)."""
    from harness import megatron_world as w

    model = w.build_gpt()
    name, layer = w.linear_layers(model)[0]
    for p in layer.parameters():
        p.requires_grad = False
    m = w.wrap_ddp(model)
    return m, w.attach_fp8_caches(m), name


@pytest.mark.parametrize("root", ["nemo_rl", "nemo_rl_pr2248"])
@pytest.mark.subprocess()
def test_nemo_rl_offload_after_refit_with_and_without_pr_2248(root: str) -> None:
    """`offload_after_refit` calling `offload_before_refit` (the 0.6+ mirror) and inlining it (PR #2248's
    head): cleared once, for the `nemo-rl-after-refit` entry, before the one flush. Its layer outside the
    DDP buffers is cleared only by a row that walks the model: with the entry off, the 0.6+ layout still
    has `nemo-rl` inside, PR #2248's has nothing. The opt-in clear is left alone with its reason."""
    import os

    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors(*([root] if root != "nemo_rl" else []))
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    from harness import megatron_world as w

    inlined = root == "nemo_rl_pr2248"
    assert ("nemo_rl_pr2248" in mpw.__file__) == inlined
    calls_before_refit = []
    real_before = mpw.MegatronPolicyWorkerImpl.offload_before_refit

    def spy(self: Any) -> None:
        calls_before_refit.append(1)
        real_before(self)

    m, n, _ = frozen_layer_chunk()
    before = w.weights(m)
    worker = mpw.MegatronPolicyWorkerImpl(m, {"megatron_cfg": {}})
    worker.offload_before_refit = spy.__get__(worker)  # type: ignore[method-assign]  # observe the inner call only
    worker.offload_after_refit()
    assert calls_before_refit == ([] if inlined else [1]), "the mirror's layout"
    assert events() == [["flush", 0]] and w.cache_state(m)["entries"] == 0, "every cache gone at the one flush"
    assert by_target() == {"nemo-rl-after-refit": [1, n]}, "one clearing, for the outer entry, nothing twice"
    worker.move_model(worker.model, "cuda")
    assert w.same_weights(before, w.weights(m))
    reset_stats()

    os.environ["TE_OFFLOAD_SHIM_DISABLE"] = "nemo-rl-after-refit"  # read at each call
    m2, n2, frozen2 = frozen_layer_chunk()
    worker2 = mpw.MegatronPolicyWorkerImpl(m2, {"megatron_cfg": {}})
    worker2.offload_after_refit()
    left = 1 if inlined else 0  # the frozen layer's one entry
    assert events() == [["flush", left]], "without the entry, PR #2248 leaves the frozen layer cached"
    by_layer = {name: mod.__dict__.get("_fp8_workspaces") for name, mod in m2.named_modules()}
    assert bool(by_layer[f"module.{frozen2}"]) == inlined
    targets = by_target()
    assert targets["megatron-core"][0] == 1 and sum(v[1] for v in targets.values()) == n2 - left
    del os.environ["TE_OFFLOAD_SHIM_DISABLE"]
    reset_stats()

    m3, _, _ = frozen_layer_chunk()
    opt_in = {"megatron_cfg": {"fp8_cfg": {"force_clear_fp8_caches": True}}}
    mpw.MegatronPolicyWorkerImpl(m3, opt_in).offload_after_refit()
    reason = "NeMo-RL fp8_cfg.force_clear_fp8_caches is on: it clears the caches itself"
    assert events() == [["flush", 0]], "NeMo-RL's own clear empties every cache before its flush"
    assert shim_stats()["left_alone"] == {"nemo-rl-after-refit": {reason: 1}}
    assert list(by_target()) == ["megatron-core"], "the buffer offload inside still clears its layers, as before"
    reset_stats()

    # What the actor process runs: the @ray.remote subclass's modified class, holding Ray's by-value copy
    # of the inherited method, which the shim's actor-class loader wraps there (as here, by hand).
    from te_offload_shim.integrations import ray as ray_integration

    actor_cls = mpw.MegatronPolicyWorker.__ray_metadata__.modified_class
    assert ray_integration.patch_copies(actor_cls) >= 1
    m4, n4, _ = frozen_layer_chunk()
    actor_cls(m4, {"megatron_cfg": {}}).offload_after_refit()
    assert events() == [["flush", 0]] and sum(v[1] for v in by_target().values()) == n4
    assert states()["nemo-rl-after-refit"] == "patched"


@pytest.mark.subprocess()
def test_nemo_rl_0_5_ray_remote_class() -> None:
    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors("nemo_rl_v0_5")
    import ray
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    assert isinstance(mpw.MegatronPolicyWorker, ray.actor.ActorClass)
    m, n = chunk()
    metadata = mpw.MegatronPolicyWorker.__ray_metadata__  # type: ignore[attr-defined]  # set by ray, not in its types
    metadata.modified_class(m, {"megatron_cfg": {}}).offload_before_refit()
    assert "nemo_rl_v0_5" in mpw.__file__
    found = states()
    assert found["nemo-rl"] == "absent" and found["nemo-rl-0.5"] == "patched"
    assert events() == [["flush", 0]] and by_target() == {"nemo-rl-0.5": [1, n]}


@pytest.mark.parametrize(
    "seed",
    # The order of the callbacks due at install once came from a set: these seeds ran the table's before
    # Ray's, which could not see through the @ray.remote class yet (the entry was reported absent); 2 did not.
    [pytest.param(s, marks=pytest.mark.subprocess(env={"PYTHONHASHSEED": s}, fresh=True)) for s in ("1", "2", "6")],
)
def test_a_ray_remote_class_imported_before_the_shim_is_patched(seed: str) -> None:
    use_mirrors("nemo_rl_v0_5")
    import ray  # noqa: F401  (before the shim, with the module holding the @ray.remote class)
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    assert os.environ["PYTHONHASHSEED"] == seed  # the child was started with it: its sets are ordered by it
    import te_offload_shim  # noqa: F401  (installs: the callbacks of everything above are due at once)

    assert states()["nemo-rl-0.5"] == "patched"
    m, n = chunk()
    mpw.MegatronPolicyWorker.__ray_metadata__.modified_class(m, {"megatron_cfg": {}}).offload_before_refit()  # type: ignore[attr-defined]
    assert events() == [["flush", 0]] and by_target() == {"nemo-rl-0.5": [1, n]}


def flush_events() -> list:
    """The mirrors' flushes since the last call; none where no mirror is loaded (the real packages)."""
    import sys

    recorder = sys.modules.get("mirror_flush")
    if recorder is None:
        return []
    got = [list(e) for e in recorder.EVENTS]
    recorder.EVENTS.clear()
    return got


def chunks_of(kinds: tuple[str, ...]) -> list:
    """Chunks with TE-layout caches: "ddp" a GPTModel in megatron DDP, "plain" the GPTModel alone."""
    from harness import megatron_world as w

    built = []
    for kind in kinds:
        model = w.build_gpt()
        built.append(w.wrap_ddp(model) if kind == "ddp" else model)
        w.attach_fp8_caches(built[-1])
    return built


def _contract_params() -> list:
    params = []
    for name, case in CASES.items():
        marks = [pytest.mark.subprocess(**case.subprocess)]
        if case.needs is not None and not (DEPS / case.needs).is_dir():
            marks.append(missing(f"{case.needs} not installed in {DEPS}"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _contract_params())
def test_contract(name: str) -> None:
    """The shim first, as a user imports it, then the entry's module: patched. Each call that moves the
    weights clears every cache of its chunks before the framework's own flushes, and counts one call
    for this entry only (an offload that calls another patched offload, such as megatron-core's buffer
    offload, counts for the outer one); a reload brings the weights back bit-identical. Each call that
    the entry's skip rule matches is left alone, and counted with its reason."""
    import importlib

    import te_offload_shim  # noqa: F401  (installs, before the target module is imported)
    from harness import megatron_world as w
    from te_offload_shim.integrations.targets import BUILTIN

    case = CASES[name]
    (target,) = [t for t in BUILTIN if t.name == name]
    case.prepare()
    module = importlib.import_module(target.module)
    assert states()[name] == "patched"
    if case.check is not None:
        case.check(module)

    for call in (case.call, *case.variants):
        chunks = chunks_of(case.chunks)
        n = w.cache_state(chunks)["entries"]
        before = [w.weights(c) for c in chunks]
        reset_stats()
        flush_events()
        made = call(module, chunks)
        assert n > 0 and w.cache_state(chunks)["entries"] == 0, "every cache of the chunks cleared"
        assert flush_events() == [[kind, 0] for kind in case.flushes], "cleared before the framework's own flushes"
        assert by_target() == {name: [1, n]}, "one call, every entry, by this entry only"
        assert shim_stats()["left_alone"] == {}
        if case.reload is not None:
            back = case.reload(module, made, chunks)
            assert back and all(w.same_weights(before[chunks.index(c)], w.weights(c)) for c in back)

    for skipped in case.left_alone:
        chunks = chunks_of(case.chunks)
        n = w.cache_state(chunks)["entries"]
        reset_stats()
        flush_events()
        skipped.call(module, chunks)
        left = 0 if skipped.clears_itself else n
        assert n > 0 and w.cache_state(chunks)["entries"] == left
        assert flush_events() == [[kind, left] for kind in case.flushes]
        assert by_target() == {}, "left alone: no call counted"
        assert shim_stats()["left_alone"] == {name: {skipped.reason: 1}}, "left alone by its skip rule, with the reason"


@pytest.mark.subprocess()
def test_areal_offload_through_awex_clears_once_for_the_outer_target() -> None:
    """AReaL's engine offload with an awex adapter calls the adapter's release_memory (itself a target):
    the engine flushes, then the adapter flushes again; both see the caches gone, one call counts."""
    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors()
    from areal.engine.awex.colocate_writer import AwexMegatronAdapter
    from areal.engine.megatron_engine import MegatronEngine

    from harness import megatron_world as w

    models = chunks_of(("ddp", "ddp"))  # two virtual-pipeline chunks
    n = w.cache_state(models)["entries"]
    before = [w.weights(m) for m in models]
    engine = MegatronEngine(models)
    engine._awex_adapter = AwexMegatronAdapter(engine)
    reset_stats()
    engine.offload()
    assert n > 0 and w.cache_state(models)["entries"] == 0
    assert flush_events() == [["flush", 0], ["flush", 0]]
    assert by_target() == {"areal": [1, n]}, "one call, every entry, by the outer target only"
    assert shim_stats()["left_alone"] == {}
    for m in models:
        for b in m.buffers + m.expert_parallel_buffers:
            b.reload_from_cpu()
    assert all(w.same_weights(b, w.weights(m)) for b, m in zip(before, models, strict=True))


@pytest.mark.subprocess()
def test_skyrl_reference_model_needs_its_own_row() -> None:
    """Without the `skyrl` row (its original, unwrapped), megatron-core's buffer offload
    (move_params=True) clears SkyRL's DDP chunk but leaves the reference model's caches: the reference
    model is built with `wrap_with_ddp=False`, and LoRA's frozen base weights are plain too."""
    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors()
    from skyrl.backends.skyrl_train.distributed.megatron import megatron_utils as skyrl

    from harness import megatron_world as w

    chunks = chunks_of(("ddp", "plain"))
    in_plain = w.cache_state(chunks[1:])["entries"]
    reset_stats()
    skyrl.offload_megatron_model_to_cpu.__wrapped__(chunks)
    left = w.cache_state(chunks)["entries"]
    assert in_plain > 0
    assert (flush_events(), list(by_target()), left) == ([["flush", in_plain]], ["megatron-core"], in_plain)


@pytest.mark.subprocess(env=mirror_env(), timeout=240)
def test_ray_actor_runs_the_patched_method() -> None:
    """Ray pickles a `@ray.remote` class by value, with a copy of each method taken when the decorator
    ran (ray.util.tracing.tracing_helper._inject_tracing_into_class, ray 2.60), and a wrapt wrapper
    pickles as the function it wraps: without te_offload_shim.integrations.ray the actor would call the
    original. In the actor process the loaded class's copies are wrapped too, so the cache is cleared."""
    import os
    from types import SimpleNamespace

    import ray
    import torch

    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "te_offload_shim.ray_setup",
            "env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]},
        },
    )
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    import te_offload_shim
    from harness import te_standins

    # Defined here, not at module level: Ray pickles them by value, as it would a user's actor code.
    class Chunk(torch.nn.Module):  # enough of a DDP for move_model: no buffers, one cached layer
        buffers: ClassVar[list] = []  # type: ignore[assignment]  # shadows Module.buffers(), as megatron DDP's does

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            # torch types Module attributes Tensor | Module; a Module takes any
            self.lin._fp8_workspaces = {"weight": te_standins.Float8TensorV2(self.lin.weight.detach())}  # type: ignore[assignment]
            self.expert_parallel_buffers: list = []

    def probe(self: Any) -> list:
        import te_offload_shim as shim

        self.model = Chunk()
        self.offload_before_refit()
        found = {t["name"]: t["state"] for t in shim.status()["targets"]}
        return [shim.stats()["calls"], len(self.model.lin._fp8_workspaces), found["nemo-rl"], found["nemo-rl-0.5"]]

    def probe_slime(self: Any) -> list:
        import te_offload_shim as shim

        self.model = [Chunk()]
        self.sleep()
        return [shim.stats()["calls"], len(self.model[0].lin._fp8_workspaces)]

    driver_calls = te_offload_shim.stats()["calls"]
    actor = mpw.MegatronPolicyWorker.remote(None, {"megatron_cfg": {}})
    calls, left, impl_state, actor_state = ray.get(actor.__ray_call__.remote(probe))
    ray.kill(actor)
    # slime makes its actor class at run time, after the shim has patched the module in the driver
    from slime.backends.megatron_utils import actor as slime_actor

    slime_class = ray.remote(num_cpus=0)(slime_actor.MegatronTrainRayActor)
    slime = slime_class.remote(SimpleNamespace(offload_train=True), [])
    slime_result = ray.get(slime.__ray_call__.remote(probe_slime))
    assert impl_state == actor_state == "patched", "the shim is installed and patched in the actor process"
    assert (calls, left) == (1, 0)
    assert slime_result == [1, 0], "a class made a Ray actor at run time, after the patch, is covered too"
    assert driver_calls == 0
