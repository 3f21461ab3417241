"""The other frameworks' offload entry points, through mirrors of their modules (tests/mirrors/).

NeMo-RL, ROLL and slime/miles are not on PyPI, and AReaL's modules do not import on a CPU-only
machine (README, "Left out, and why"): each mirror reproduces the real module path, class, signature and the
lines that matter, citing the upstream file and commit. The models are real megatron DDP chunks with
TE-layout caches; the mirrors' flushes record what is still cached at that moment. Each test runs in
a fresh interpreter; this module imports nothing heavy at its top.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from conftest import mirror_env, use_mirrors


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
    from te_offload_shim.engine import handler

    handler.reset_stats()


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

    # offload_after_refit: Megatron's buffer offload (params move) runs first, then offload_before_refit.
    m4, n4 = chunk()
    before4 = w.weights(m4)
    worker4 = mpw.MegatronPolicyWorkerImpl(m4, {"megatron_cfg": {}})
    worker4.offload_after_refit()
    assert events() == [["flush", 0]]
    targets4 = by_target()
    assert targets4["megatron-core"] == [1, n4] and targets4["nemo-rl"] == [1, 0]
    worker4.move_model(worker4.model, "cuda")
    assert w.same_weights(before4, w.weights(m4))
    reset_stats()

    m5, n5 = chunk()
    old.MegatronPolicyWorker.__ray_metadata__.modified_class(m5, {"megatron_cfg": {}}).offload_before_refit()
    assert events() == [["flush", 0]] and by_target() == {"nemo-rl-0.3": [1, n5]}
    found = states()
    assert found["nemo-rl"] == found["nemo-rl-0.3"] == "patched"


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


CLEARED_BEFORE_FLUSH = [["flush", 0]]


@pytest.mark.subprocess(timeout=240)
def test_roll_areal_slime_miles() -> None:
    from enum import Enum
    from types import SimpleNamespace

    import te_offload_shim  # noqa: F401  (installs, before the mirrors are imported)

    use_mirrors()
    from areal.engine.awex.colocate_writer import AwexMegatronAdapter
    from areal.engine.megatron_engine import MegatronEngine
    from areal.experimental.weight_update.awex.megatron_adapter import AwexMegatronAdapter as Awex104
    from miles.backends.megatron_utils.actor import MegatronTrainRayActor as Miles
    from roll.distributed.strategy.megatron_strategy import MegatronInferStrategy, MegatronTrainStrategy
    from roll.utils.offload_states import OffloadStateType as T
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor as Slime

    from harness import megatron_world as w

    assert issubclass(T, str) and issubclass(T, Enum)
    r: dict[str, list] = {}
    left_alone: dict[str, dict] = {}

    def case(name: str, make: Any, call: Any) -> tuple[list, list]:
        models = [chunk()[0] for _ in range(2)]  # two virtual-pipeline chunks
        n = sum(w.cache_state([m])["entries"] for m in models)
        before = [w.weights(m) for m in models]
        reset_stats()
        call(make(models))
        r[name] = [n, events(), by_target(), w.cache_state(models)["entries"]]
        left_alone[name] = shim_stats()["left_alone"]
        return models, before

    def cleared(name: str, target: str, flushes: list | None = None) -> None:
        n, got, targets, left = r[name]
        assert left == 0 and got == (flushes or CLEARED_BEFORE_FLUSH), name
        assert targets == {target: [1, n]}, f"{name}: one call, every entry, by the outer target only"
        assert left_alone[name] == {}, name

    def untouched(name: str, target: str, reason: str) -> None:
        n, got, targets, left = r[name]
        assert left == n and got == [["flush", n]] and targets == {}, name
        assert left_alone[name] == {target: {reason: 1}}, f"{name}: left alone by its skip rule, with the reason"

    roll_cases = [
        ("roll_none", None),
        ("roll_list", [T.model_params]),
        ("roll_set", {T.model_params, T.optimizer_states}),
        ("roll_one", T.model_params),
        ("roll_opt", [T.optimizer_states, T.other_params]),
    ]
    for label, include in roll_cases:
        case(label, MegatronTrainStrategy, lambda s, include=include: s.offload_states(include=include))
        case(label + "_infer", MegatronInferStrategy, lambda s, include=include: s.offload_states(include))

    awex_cases = [("awex_none", None), ("awex_empty", []), ("awex_weights", ["weights"]), ("awex_opt", ["optimizer"])]
    for label, tags in awex_cases:
        case(
            label, lambda ms: AwexMegatronAdapter(SimpleNamespace(model=ms)), lambda a, t=tags: a.release_memory(tags=t)
        )
        case(label + "_104", lambda ms: Awex104(SimpleNamespace(model=ms)), lambda a, t=tags: a.release_memory(t))

    def engine_with_awex(ms: list) -> Any:
        e = MegatronEngine(ms)
        e._awex_adapter = AwexMegatronAdapter(e)
        return e

    models, before = case("areal_awex_nested", engine_with_awex, lambda e: e.offload())
    for m in models:
        for b in m.buffers + m.expert_parallel_buffers:
            b.reload_from_cpu()
    areal_awex_same = all(w.same_weights(b, w.weights(m)) for b, m in zip(before, models, strict=True))
    case("areal_tms", lambda ms: MegatronEngine(ms, disable_grad_buffers_cpu_backup=True), lambda e: e.offload())

    args = dict(offload_train=True, transformer_impl="transformer_engine", cuda_graph_impl="none")
    case("slime", lambda ms: Slime(SimpleNamespace(**args), ms), lambda a: a.sleep())
    flag = "clear_quantized_weight_workspaces_on_offload"
    case("miles_flag_on", lambda ms: Miles(SimpleNamespace(**{flag: True}, **args), ms), lambda a: a.sleep())
    case("miles_flag_off", lambda ms: Miles(SimpleNamespace(**{flag: False}, **args), ms), lambda a: a.sleep())
    case("miles_before_pr", lambda ms: Miles(SimpleNamespace(**args), ms), lambda a: a.sleep())
    found = states()

    for label in ("roll_none", "roll_list", "roll_set", "roll_one"):
        cleared(label, "roll-train")
        cleared(label + "_infer", "roll")
    no_params = "include names no model_params: the weights stay on the device"
    untouched("roll_opt", "roll-train", no_params)
    untouched("roll_opt_infer", "roll", no_params)
    for label in ("awex_none", "awex_empty", "awex_weights"):
        cleared(label, "areal-awex")
        cleared(label + "_104", "areal-awex-1.0")
    no_weights = "tags name no weights: the weights stay on the device"
    untouched("awex_opt", "areal-awex", no_weights)
    untouched("awex_opt_104", "areal-awex-1.0", no_weights)
    # engine.offload flushes, then the adapter flushes again: both must see the caches gone
    cleared("areal_awex_nested", "areal", [["flush", 0], ["flush", 0]])
    assert areal_awex_same
    cleared("areal_tms", "areal", [["flush", 0], ["pause", 0]])
    cleared("slime", "slime", [["flush", 0], ["pause", 0]])
    _, got, targets, left = r["miles_flag_on"]
    assert left == 0 and got == [["flush", 0], ["pause", 0]] and targets == {}, "miles clears itself: left alone"
    reason = "miles --clear-quantized-weight-workspaces-on-offload is on: it clears the caches itself"
    assert left_alone["miles_flag_on"] == {"miles": {reason: 1}}
    cleared("miles_flag_off", "miles", [["flush", 0], ["pause", 0]])
    cleared("miles_before_pr", "miles", [["flush", 0], ["pause", 0]])
    for name in ("roll", "roll-train", "areal-awex", "areal-awex-1.0", "areal", "slime", "miles"):
        assert found[name] == "patched", name


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
