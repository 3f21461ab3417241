"""One wrapped offload inside another: cleared once, and never silenced by an outer wrapper that cleared nothing.

An offload that calls another patched offload (SkyRL's function reaching megatron-core's buffer
offload, a user's method calling a table target) is cleared once, by the outer wrapper. But only a
wrapper that actually cleared the models covers the inner one: a target switched off at run time,
or a user spec that finds nothing, must never silence the target inside it. Adding or disabling a
target never clears less than not having it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hostile_util import write_module


def _ddp() -> Any:
    from harness import megatron_world as w

    model = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
    w.attach_fp8_caches(model)
    return model


@pytest.mark.subprocess(timeout=240)
def test_switching_one_target_off_at_run_time_leaves_the_target_inside_it_on() -> None:
    import sys

    from conftest import REPO

    import te_offload_shim as shim
    from harness import megatron_world as w

    sys.path[:0] = [str(REPO / "tests" / "mirrors")]
    import mirror_flush
    from skyrl.backends.skyrl_train.distributed.megatron import megatron_utils as skyrl

    chunks = [_ddp()]
    skyrl.offload_megatron_model_to_cpu(chunks)  # both on: SkyRL's wrapper clears, megatron-core's steps aside
    assert w.cache_state(chunks)["entries"] == 0
    assert list(shim.stats()["by_target"]) == ["skyrl"]
    skyrl.load_megatron_model_to_gpu(chunks)

    os.environ["TE_OFFLOAD_SHIM_DISABLE"] = "skyrl"  # in the running process: read at each offload
    w.attach_fp8_caches(chunks[0])
    entries = w.cache_state(chunks)["entries"]
    mirror_flush.EVENTS.clear()
    skyrl.offload_megatron_model_to_cpu(chunks)
    assert w.cache_state(chunks)["entries"] == 0 < entries, "megatron-core's buffer offload inside it cleared"
    assert mirror_flush.EVENTS == [("flush", 0)], "before the flush"
    inner = shim.stats()["by_target"]["megatron-core"]
    assert (inner["calls"], inner["entries"]) == (1, entries) and inner["bytes"] > 0, inner


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "nesting_trainer:Worker.sleep@self.model"}, timeout=240)
def test_a_user_target_whose_spec_finds_nothing_never_silences_a_table_target(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import te_offload_shim as shim
    from harness import megatron_world as w

    source = (
        "class Worker:\n"
        "    def __init__(self, chunks):\n"
        "        self.chunks = chunks  # not `model`: the spec discover proposed finds nothing\n"
        "    def sleep(self):\n"
        "        for chunk in self.chunks:\n"
        "            for buffer in chunk.buffers:\n"
        "                buffer.offload_to_cpu()\n"
    )
    write_module(tmp_path, "nesting_trainer", source)
    import nesting_trainer  # type: ignore[import-not-found]

    chunks = [_ddp()]
    entries = w.cache_state(chunks)["entries"]
    nesting_trainer.Worker(chunks).sleep()
    states = {r["name"]: r["state"] for r in shim.status()["targets"]}
    assert states["nesting_trainer:Worker.sleep"] == states["megatron-core"] == "patched"
    assert w.cache_state(chunks)["entries"] == 0 < entries, "the table target inside the user's method cleared"
    assert shim.stats()["by_target"]["megatron-core"]["entries"] == entries
    said = [r.getMessage() for r in caplog.records if "finds nothing" in r.getMessage()]
    assert len(said) == 1 and "'self.model'" in said[0] and "Worker has no attribute 'model'" in said[0], said


_TRAINER = """\
class Trainer:
    def __init__(self, actor, ref):
        self.actor = actor
        self.ref = ref

    def sleep(self):  # offloads both models, each through megatron-core's buffer offload
        for chunks in (self.actor, self.ref):
            for chunk in chunks:
                for buffer in chunk.buffers:
                    buffer.offload_to_cpu()
"""


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "two_models:Trainer.sleep@self.actor"}, timeout=240)
def test_an_outer_wrapper_covers_only_the_chunks_it_cleared(tmp_path: Path) -> None:
    """A user target whose spec names one of the two models its method offloads: the table target
    inside still clears the other one (it was silenced for every chunk)."""
    import te_offload_shim as shim
    from harness import megatron_world as w

    write_module(tmp_path, "two_models", _TRAINER)
    import two_models  # type: ignore[import-not-found]

    def ddp() -> object:
        model = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
        w.attach_fp8_caches(model)
        return model

    actor, ref = [ddp()], [ddp()]
    in_ref = w.cache_state(ref)["entries"]
    two_models.Trainer(actor, ref).sleep()
    assert w.cache_state(actor)["entries"] == 0, "the user's target cleared the model its spec names"
    assert w.cache_state(ref)["entries"] == 0 < in_ref, "megatron-core's buffer offload cleared the other"
    by_target = {k: (v["calls"], v["entries"]) for k, v in shim.stats()["by_target"].items()}
    assert by_target["megatron-core"] == (1, in_ref), "once: the actor's buffer was covered by the outer clearing"
