"""Scenario 8: the shim never iterates what the offload will iterate, unless it is a module, a list
or a tuple (and those only through `list.__iter__` / `tuple.__iter__`).

Real verl 0.8.0 `offload_megatron_model_to_cpu(models)` (its body is `for model_chunk in models:`)
on a real megatron GPTModel in DDP with TE-layout caches.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.subprocess(verl="0.8.0")
def test_iterables_the_offload_iterates_are_left_to_it(caplog: pytest.LogCaptureFixture) -> None:
    import queue

    import verl.utils.megatron_utils as mu

    import te_offload_shim as shim
    from harness import megatron_world as w

    class Drain:
        """A work queue of chunks: iterating it consumes it (not an Iterator: no __next__)."""

        def __init__(self, chunks: list) -> None:
            self.queue: queue.Queue = queue.Queue()
            for chunk in chunks:
                self.queue.put(chunk)

        def __iter__(self):
            while not self.queue.empty():
                yield self.queue.get()

    class CountingList(list):
        iterations = 0

        def __iter__(self):
            CountingList.iterations += 1
            return super().__iter__()

    def fresh() -> object:
        model = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
        w.attach_fp8_caches(model)
        return model

    def offloaded(model: Any) -> bool:  # megatron DDP (untyped): its `buffers` list
        return all(b.param_data.untyped_storage().size() == 0 for b in model.buffers)

    # A single-pass iterable: verl must still get the chunk; the shim clears nothing and says so.
    model = fresh()
    initial = w.cache_state([model])
    assert initial["entries"] > 0
    mu.offload_megatron_model_to_cpu(Drain([model]))
    assert offloaded(model), "the shim drained the iterable: verl offloaded nothing"
    assert w.cache_state([model]) == initial, "what the shim did not iterate it did not clear"
    mu.load_megatron_model_to_gpu([model])

    again = Drain([model])  # the same type again: no second warning, and scan() leaves it whole
    report = shim.scan(again)
    assert again.queue.qsize() == 1
    assert [(s.where, "not iterated" in s.reason) for s in report.skipped] == [("models", True)]
    assert report.errors == [] and report.entries == 0

    # A set and a dict: the same rule, one warning per type.
    for models in ({model}, {"chunk": model}):
        assert [s.where for s in shim.clear_fp8_workspaces(models).skipped] == ["models"]
    assert w.cache_state([model]) == initial

    # A list subclass whose __iter__ is overridden: cleared, but only verl calls that __iter__.
    model = fresh()
    mu.offload_megatron_model_to_cpu(CountingList([model]))
    assert offloaded(model) and w.cache_state([model])["entries"] == 0
    assert CountingList.iterations == 1, "the shim called the list's own __iter__"

    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "te_offload_shim" and r.levelname == "WARNING" and "FP8 weight workspaces" not in r.getMessage()
    ]  # the problems; the first clearing's own line is at WARNING too under default logging
    assert len(warnings) == 3, warnings  # Drain, set, dict
    assert all("Pass a list" in m for m in warnings)
    assert "Drain" in warnings[0] and "a set" in warnings[1] and "a dict" in warnings[2]
    stats = shim.stats()
    assert stats["calls"] == 2 and stats["skipped"] == 1 and stats["errors"] == 0
