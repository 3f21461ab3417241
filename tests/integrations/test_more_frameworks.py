"""SkyRL, RLinf, ChatLearn and Relax, through mirrors of their modules (tests/mirrors/), in one fresh
interpreter.

None of them imports on this CPU-only Python 3.11 set-up (each mirror's docstring says why and cites
the upstream file and commit). The models are real megatron-core DDP chunks (and plain chunks where
the framework offloads those) with TE-layout caches; the mirrors' flushes record what is still cached
at that moment. ms-swift runs for real in tests/integrations/test_ms_swift.py.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.subprocess(timeout=240)
def test_skyrl_rlinf_chatlearn_relax() -> None:
    import sys
    from types import SimpleNamespace

    from conftest import REPO

    import te_offload_shim as shim
    from te_offload_shim.engine import handler

    sys.path[:0] = [str(REPO / "tests" / "mirrors")]
    import mirror_flush
    from chatlearn.models.megatron.memory_manager.inference import InferenceMemoryManager
    from chatlearn.models.megatron.memory_manager.trainer import TrainerMemoryManager
    from relax.backends.megatron.actor import MegatronTrainRayActor
    from relax.backends.megatron.weight_update.train_offload import _SelectiveOffloadStrategy
    from rlinf.hybrid_engines.megatron.megatron_model_manager import MegatronModelManager
    from skyrl.backends.skyrl_train.distributed.megatron import megatron_utils as skyrl
    from skyrl_train.distributed.megatron import megatron_utils as skyrl_train

    from harness import megatron_world as w

    def run(chunks: list, call: object) -> tuple[int, list, dict, int]:
        """Entries before, flush events, {target: [calls, entries]}, entries left."""
        n = w.cache_state(chunks)["entries"]
        handler.reset_stats()
        mirror_flush.EVENTS.clear()
        call()  # type: ignore[operator]
        by_target = {k: [v["calls"], v["entries"]] for k, v in shim.stats()["by_target"].items()}
        return n, [list(e) for e in mirror_flush.EVENTS], by_target, w.cache_state(chunks)["entries"]

    def ddp() -> Any:  # megatron's DDP and GPTModel: untyped
        model = w.wrap_ddp(w.build_gpt())
        w.attach_fp8_caches(model)
        return model

    def plain() -> Any:
        model = w.build_gpt()
        w.attach_fp8_caches(model)
        return model

    def cleared(result: tuple, target: str, events: list | None = None) -> None:
        n, got, by_target, left = result
        assert n > 0 and left == 0, (target, result)
        assert got == (events or [["flush", 0]]), (target, result)
        assert by_target == {target: [1, n]}, (target, result)

    # SkyRL 0.3.0: a DDP chunk (through megatron-core's buffer offload, itself a target) and the
    # reference model as a plain chunk, which the megatron-core entry alone would miss.
    chunks = [ddp(), plain()]
    before = w.weights(chunks[0])
    cleared(run(chunks, lambda: skyrl.offload_megatron_model_to_cpu(chunks)), "skyrl")
    skyrl.load_megatron_model_to_gpu(chunks[:1])
    assert w.same_weights(before, w.weights(chunks[0]))

    # Without the `skyrl` row (its original, unwrapped), megatron-core's buffer offload
    # (move_params=True) clears the DDP chunk but leaves the reference model's caches.
    chunks = [ddp(), plain()]
    in_plain = w.cache_state(chunks[1:])["entries"]
    _, got, by_target, left = run(chunks, lambda: skyrl.offload_megatron_model_to_cpu.__wrapped__(chunks))
    assert (got, list(by_target), left) == ([["flush", in_plain]], ["megatron-core"], in_plain)

    chunks = [ddp(), plain()]
    cleared(run(chunks, lambda: skyrl_train.offload_megatron_model_to_cpu(chunks)), "skyrl-train")

    # RLinf: only when weights move; a grads-only offload leaves the (still valid) caches alone.
    chunks = [ddp(), ddp()]
    manager = MegatronModelManager(chunks)
    n, got, by_target, left = run(chunks, lambda: manager.offload_model_weights_and_grad(offload_weight=False))
    assert (got, by_target, left) == ([["flush", n]], {}, n)
    reason = "offload_weight=False: a grads-only offload leaves the weights and their caches"
    assert shim.stats()["left_alone"] == {"rlinf": {reason: 1}}, "left alone by its skip rule, with the reason"
    before_each = [w.weights(c) for c in chunks]
    cleared(run(chunks, lambda: manager.offload_model_weights_and_grad()), "rlinf")
    manager.onload_model_weights_and_grad()
    assert all(w.same_weights(b, w.weights(c)) for b, c in zip(before_each, chunks, strict=True))

    # ChatLearn: no flush inside; the caller (TorchModule.offload) flushes after it.
    chunks = [ddp()]
    trainer = TrainerMemoryManager(chunks, None)
    before = w.weights(chunks[0])

    def torch_module_offload(manager: object) -> None:
        manager.offload_weights()  # type: ignore[attr-defined]
        mirror_flush.empty_cache(chunks)

    cleared(run(chunks, lambda: torch_module_offload(trainer)), "chatlearn")
    trainer.onload_weights()
    assert w.same_weights(before, w.weights(chunks[0]))
    chunks = [plain()]
    cleared(run(chunks, lambda: torch_module_offload(InferenceMemoryManager(chunks))), "chatlearn-inference")

    # Relax: the actor's sleep (flush, then torch_memory_saver.pause) and the selective strategy.
    chunks = [ddp(), ddp()]
    actor = MegatronTrainRayActor(SimpleNamespace(offload_train=True), chunks)
    cleared(run(chunks, actor.sleep), "relax", [["flush", 0], ["pause", 0]])
    chunks = [ddp()]
    strategy = _SelectiveOffloadStrategy(chunks, None, SimpleNamespace())
    before = w.weights(chunks[0])
    cleared(run(chunks, strategy.offload), "relax-selective")
    strategy.reload()
    assert w.same_weights(before, w.weights(chunks[0]))

    states = {t["name"]: t["state"] for t in shim.status()["targets"]}
    for name in ("skyrl", "skyrl-train", "rlinf", "chatlearn", "chatlearn-inference", "relax", "relax-selective"):
        assert states[name] == "patched", (name, states[name])
