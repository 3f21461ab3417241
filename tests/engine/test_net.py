"""The flush net (engine/net.py): `torch.cuda.empty_cache` clears the FP8 caches of every TE layer
whose weights have left the device, whatever function led to the flush; nothing else.

Every test runs in a fresh interpreter on TE's own layers (TE 2.20.2 on the CPU twin), with the
table's rows out of play (`TE_OFFLOAD_SHIM_DISABLE=*`) unless it says otherwise: what clears
here is the net alone. The twin answers `Tensor.is_cuda` for its CPU tensors, so a twin weight with
bytes is "on the device" and one resized to zero bytes has left it (te/placement.py's seam).
This module imports nothing heavy at its top: the fresh interpreters import it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pytest

NO_TABLE = {"TE_OFFLOAD_SHIM_DISABLE": "*"}


def _cuda() -> Any:
    """`torch.cuda`, untyped: the flushes under test return what they wrap (a recorder's token), not
    the None torch's stubs declare."""
    import torch

    return torch.cuda


def _flush_from_an_unknown_offload() -> None:
    import torch

    torch.cuda.empty_cache()  # the line the log must name


def _net_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "the target table does not know" in r.getMessage()]


@pytest.mark.subprocess()
def test_a_process_without_te_keeps_torchs_own_flush_function() -> None:
    import torch

    import te_offload_shim

    own = vars(torch.cuda.memory)["empty_cache"]
    assert torch.cuda.empty_cache is own, "torch.cuda.empty_cache is the very function torch defines"
    assert own.__code__.co_filename.endswith("torch/cuda/memory.py") and not hasattr(own, "__wrapped__")
    assert "te_offload_shim.engine.net" not in sys.modules, "nothing of the net is loaded without TE"
    net = te_offload_shim.status()["net"]
    assert net["state"] == "not armed" and "not imported" in net["detail"]
    assert te_offload_shim.stats()["net"]["flushes"] == 0


@pytest.mark.subprocess(env={**NO_TABLE, "RANK": "0"})
def test_an_offloaded_layer_is_cleared_at_the_flush_and_the_line_names_the_caller(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    caplog.set_level(logging.NOTSET, logger="te_offload_shim")
    logging.getLogger().setLevel(logging.WARNING)
    offloaded, kept, swapped = (net_case.cached_linear(te, seed) for seed in range(3))
    net_case.offload_like_megatron(offloaded)
    net_case.offload_off_the_device_type(swapped)
    _flush_from_an_unknown_offload()

    assert (net_case.entries(offloaded), net_case.entries(kept), net_case.entries(swapped)) == (0, 1, 0)
    records = _net_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING, "the first clearing, seen on rank 0"
    line = _flush_from_an_unknown_offload.__code__.co_firstlineno + 3
    assert records[0].getMessage() == (
        "[rank 0] an offload the target table does not know left 2 FP8 weight caches "
        f"({te_offload_shim.stats()['net']['bytes'] / 1024:.2f} KiB) in 2 layers; cleared at "
        f"torch.cuda.empty_cache called from {__file__}:{line} in _flush_from_an_unknown_offload"
    )
    net = te_offload_shim.status()["net"]
    assert net["state"] == "armed" and net["flushes"] == 1 and net["cleared_flushes"] == 1
    assert (net["layers"], net["entries"], net["live_layers"]) == (2, 2, 3)
    assert net["bytes"] == te_offload_shim.stats()["net"]["bytes"] > 0
    assert net["callers"] == [f"{__file__}:{line} in _flush_from_an_unknown_offload"]
    assert te_offload_shim.stats()["entries"] == 0, "the table's totals stay the table's"
    from te_offload_shim import cli

    capsys.readouterr()
    cli.main(["status"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("flush net:")]
    assert printed == [
        "flush net: armed: wraps torch.cuda.empty_cache, torch.cuda.memory.empty_cache; 1 flushes seen, 1 cleared "
        f"2 caches in 2 layers ({net['bytes'] / 1024:.2f} KiB); 3 TE layers known; called from {net['callers'][0]}"
    ]

    net_case.offload_like_megatron(kept)
    _flush_from_an_unknown_offload()
    assert net_case.entries(kept) == 0
    assert len(_net_records(caplog)) == 1, "later clearings log at DEBUG"


@pytest.mark.subprocess(env=NO_TABLE)
def test_flushes_between_microbatches_and_steps_clear_nothing_and_change_no_kernel_call() -> None:
    import os

    import torch
    from support import net_case

    import te_offload_shim
    from harness.te_twin import counters

    te = net_case.load()

    def train(net: str) -> tuple[Any, list[float], list[torch.Tensor]]:
        os.environ["TE_OFFLOAD_SHIM_NET"] = net  # read at every flush
        layers = [net_case.cached_linear(te, seed) for seed in (7, 8)]
        losses = []
        with counters.counting():
            for _step in range(2):
                for microbatch in range(2):
                    for layer in layers:
                        losses.append(float(net_case.forward(layer, is_first_microbatch=microbatch == 0)))
                    torch.cuda.empty_cache()  # between microbatches, weights on the device
                torch.cuda.empty_cache()  # between steps
                assert all(net_case.entries(layer) == 1 for layer in layers)
        return counters.calls.copy(), losses, [p.detach().clone() for layer in layers for p in layer.parameters()]

    on = train("1")
    seen = te_offload_shim.stats()["net"]
    off = train("0")
    assert seen["flushes"] == 6 and seen["cleared_flushes"] == 0 and seen["entries"] == 0
    assert on[0] == off[0] and sum(on[0].values()) > 0, "the same TE kernel calls, one by one"
    assert on[1] == off[1], "the same losses"
    assert all(torch.equal(a, b) for a, b in zip(on[2], off[2], strict=True))
    assert te_offload_shim.stats()["net"]["flushes"] == 6, "TE_OFFLOAD_SHIM_NET=0 leaves every flush alone"


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_layer_half_on_the_device_is_left_alone() -> None:
    import torch
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    half = net_case.cached_linear(te)
    half.weight.data.untyped_storage().resize_(0)  # the bias stays on the device
    torch.cuda.empty_cache()
    assert net_case.entries(half) == 1
    assert te_offload_shim.status()["net"]["cleared_flushes"] == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_layer_the_net_cannot_decide_is_counted_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    """A TE layer whose weights were offloaded but for an own parameter empty on the device (no
    bytes, no elements, no offload's mark: what a reshard leaves, and an offload that marks nothing)
    keeps its caches, as the rule keeps any layer it cannot decide, and says so: counted per flush
    in `status()["net"]["undecided"]` and `stats()["net"]`, named `Class.parameter`, and shown in the
    `te-offload-shim status` line. A layer with a weight on the device holding bytes is decided (on),
    and a sharding wrapper's is decided too: neither counts."""
    import torch
    from support import net_case

    import te_offload_shim
    from te_offload_shim import cli

    te = net_case.load()
    undecided, on, sharded = (net_case.cached_linear(te, seed) for seed in range(3))
    undecided.weight.data.untyped_storage().resize_(0)  # offloaded as megatron-core's buffer does
    undecided.bias.data = torch.empty(0)  # an empty tensor on the device: the twin's device is its CPU
    on.bias.data = torch.empty(0)  # its weight is on the device, with its bytes
    sharded.weight.data.untyped_storage().resize_(0)
    sharded.bias.data = torch.empty(0)
    sharded.bias.ds_id = 0  # DeepSpeed ZeRO-3's mark: a reshard, never an offload
    for _ in range(2):
        torch.cuda.empty_cache()
    assert [net_case.entries(layer) for layer in (undecided, on, sharded)] == [1, 1, 1], "nothing cleared"
    row = te_offload_shim.status()["net"]
    assert (row["undecided"], row["undecided_layers"], row["cleared_flushes"]) == (2, ["Linear.bias"], 0), row
    assert te_offload_shim.stats()["net"]["undecided"] == 2
    capsys.readouterr()
    cli.main(["status"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("flush net:")]
    assert len(printed) == 1 and printed[0].endswith(
        "; 2 TE layers left undecided (an own weight empty on the device, as a reshard or an offload that marks "
        "nothing leaves it): Linear.bias"
    ), printed


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_direct_check_leaves_the_next_flush_checked() -> None:
    """The check called directly (as benchmarks/net.py times it) puts the per-thread mark back as it
    found it: it left the mark set, and every later flush of that thread skipped the net unsaid."""
    import torch
    from support import net_case

    from te_offload_shim.engine import net

    te = net_case.load()
    layer = net_case.cached_linear(te)
    net._before_flush("direct")
    net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 0, "the flush after a direct check was not checked"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_NET": "0", "TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"})
def test_switched_off_the_flush_stays_as_it_was_and_the_table_still_clears() -> None:
    import torch
    from support import net_case

    import te_offload_shim

    net_case.install_device()
    before = torch.cuda.empty_cache  # the twin's flush, in place before TE is imported
    te = net_case.load()
    assert torch.cuda.empty_cache is before
    assert te_offload_shim.status()["net"]["state"] == "off"
    layer = net_case.cached_linear(te)
    net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 1, "the net is off"
    net_case.use_targets()
    import shim_targets

    shim_targets.offload([layer])
    assert net_case.entries(layer) == 0 and te_offload_shim.stats()["entries"] == 1, "the table still works"


@pytest.mark.subprocess(env=NO_TABLE)
def test_switched_off_at_run_time_every_flush_is_left_alone() -> None:
    import os

    import torch
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    layer = net_case.cached_linear(te)
    net_case.offload_like_megatron(layer)
    os.environ["TE_OFFLOAD_SHIM_NET"] = "0"
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 1
    assert te_offload_shim.status()["net"]["state"] == "off"
    os.environ["TE_OFFLOAD_SHIM"] = "0"
    os.environ["TE_OFFLOAD_SHIM_NET"] = "1"
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 1, "TE_OFFLOAD_SHIM=0 turns everything off"
    del os.environ["TE_OFFLOAD_SHIM"]
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_uninstall_puts_back_exactly_the_flush_functions_their_aliases_and_tes_class(tmp_path: Any) -> None:
    import torch
    from support import net_case

    import te_offload_shim

    net_case.install_device()
    twin_flush = torch.cuda.empty_cache  # what torch.cuda holds when the net arms: the twin's
    torch_flush = vars(torch.cuda.memory)["empty_cache"]  # torch's own, still in torch.cuda.memory
    (tmp_path / "flush_alias.py").write_text("from torch.cuda.memory import empty_cache\n")
    sys.path.insert(0, str(tmp_path))
    import flush_alias

    te = net_case.load()
    base = sys.modules["transformer_engine.pytorch.module.base"].TransformerEngineBaseModule
    assert _cuda().empty_cache is not twin_flush and _cuda().empty_cache.__wrapped__ is twin_flush
    assert _cuda().memory.empty_cache.__wrapped__ is torch_flush
    assert flush_alias.empty_cache is torch.cuda.memory.empty_cache, "an alias made before is rebound"
    hooked_init = vars(base)["__init__"]

    te_offload_shim.uninstall()
    assert torch.cuda.empty_cache is twin_flush
    assert vars(torch.cuda.memory)["empty_cache"] is torch_flush and flush_alias.empty_cache is torch_flush
    assert vars(base)["__init__"] is hooked_init.__wrapped__ and "__setstate__" not in vars(base)
    net = te_offload_shim.status()["net"]
    assert (net["state"], net["detail"]) == ("not armed", "uninstalled"), net
    layer = net_case.cached_linear(te)
    net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert net_case.entries(layer) == 1


@pytest.mark.subprocess(env=NO_TABLE)
def test_arming_again_wraps_no_flush_twice_and_passes_over_an_entry_it_cannot_wrap() -> None:
    """The flush functions the net wraps are data (integrations/flush.py): an entry naming a module
    that is not loaded, or an attribute that is no function, is passed over and the others are
    wrapped. Arming again (TE's base module imported afresh) wraps no flush a second time."""
    import torch
    from support import net_case

    from te_offload_shim.engine import net
    from te_offload_shim.integrations import flush

    net_case.install_device()
    net_case.load()
    base = sys.modules["transformer_engine.pytorch.module.base"]
    wrapped, memory_wrapped = torch.cuda.empty_cache, vars(torch.cuda.memory)["empty_cache"]
    hooked = {name: vars(base.TransformerEngineBaseModule)[name] for name in ("__init__", "__setstate__")}
    torch.cuda.not_a_flush = "a setting"  # type: ignore[attr-defined]
    odd = (("no_such_module", "empty_cache"), ("torch.cuda", "not_a_flush"))
    assert net.arm(base, flush.TE_BASE_CLASS, flush.FLUSHES + odd, te_ready=True) == "armed"
    assert torch.cuda.empty_cache is wrapped and vars(torch.cuda.memory)["empty_cache"] is memory_wrapped, "once"
    assert torch.cuda.not_a_flush == "a setting"  # type: ignore[attr-defined]
    assert {name: vars(base.TransformerEngineBaseModule)[name] for name in hooked} == hooked, "TE's class once"


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_second_base_class_is_hooked_too_and_its_own_setstate_still_runs() -> None:
    """A base class the net has not hooked yet (TE's base module imported afresh makes a new one) is
    hooked beside the first; where the class defines its own `__setstate__` (TE 1.x - 2.20's does
    not), the net's runs it, then notes the layer made without `__init__`."""
    import copy
    import types

    import torch
    from support import net_case

    from te_offload_shim.engine import net
    from te_offload_shim.integrations import flush
    from te_offload_shim.te import layers

    net_case.install_device()
    net_case.load()
    restored = []

    class Base(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()

        def __setstate__(self, state: dict) -> None:
            restored.append(state)
            super().__setstate__(state)

    module = types.ModuleType("afresh")
    module.Base = Base  # type: ignore[attr-defined]
    assert net.arm(module, "Base", flush.FLUSHES, te_ready=False) == "armed"
    built = Base()
    made = copy.deepcopy(built)
    assert len(restored) == 1, "the class's own __setstate__ ran"
    noted = [ref() for ref in layers.entries()]
    assert any(layer is built for layer in noted) and any(layer is made for layer in noted), noted


@pytest.mark.subprocess(env=NO_TABLE)
def test_each_way_the_net_arms_or_not_is_said_in_its_row_word_for_word(caplog: pytest.LogCaptureFixture) -> None:
    """The net's row (`status()["net"]`) says how its arming went: armed and what it wraps; TE's
    module without its base class; an arming that failed (warned about once); switched off when TE
    was imported; and the shim not installed (uninstalled before the arming ran)."""
    from support import net_case

    import te_offload_shim
    from te_offload_shim.engine import net
    from te_offload_shim.integrations import flush

    def row() -> tuple[str, str]:
        said = te_offload_shim.status()["net"]
        return said["state"], said["detail"]

    net_case.install_device()
    net_case.load()
    base = sys.modules["transformer_engine.pytorch.module.base"]
    assert row() == ("armed", "wraps torch.cuda.empty_cache, torch.cuda.memory.empty_cache")
    assert net.arm(base, "NoSuchClass", flush.FLUSHES, te_ready=True) == "error"
    assert row() == ("error", f"{base.__name__} has no class NoSuchClass: no layer can be found")
    with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
        for _ in range(2):
            assert net.arm(object(), flush.TE_BASE_CLASS, flush.FLUSHES, te_ready=True) == "error"
    why = "vars() argument must have __dict__ attribute"
    assert row() == ("error", f"arming failed: TypeError: {why}")
    assert [r.getMessage() for r in caplog.records] == [f"the flush net could not be armed: TypeError: {why}"], "once"
    os.environ["TE_OFFLOAD_SHIM_STRICT"] = "1"  # strict mode: the arming's own error, raised
    with pytest.raises(TypeError, match=r"vars\(\) argument"):
        net.arm(object(), flush.TE_BASE_CLASS, flush.FLUSHES, te_ready=True)
    del os.environ["TE_OFFLOAD_SHIM_STRICT"]
    os.environ["TE_OFFLOAD_SHIM_NET"] = "0"
    assert net.arm(base, flush.TE_BASE_CLASS, flush.FLUSHES, te_ready=True) == "off"
    assert row() == ("off", "TE_OFFLOAD_SHIM_NET=0 when TE was imported: torch's flush is left as it is")
    del os.environ["TE_OFFLOAD_SHIM_NET"]
    te_offload_shim.uninstall()
    assert net.arm(base, flush.TE_BASE_CLASS, flush.FLUSHES, te_ready=True) == "not armed"
    assert row() == ("not armed", "the shim is not installed")


@pytest.mark.subprocess(env=NO_TABLE, fresh=True)
def test_the_net_arms_where_torchdynamo_is_not_loaded_and_loads_it_not() -> None:
    """`import torch` does not load TorchDynamo, and a TE release or stand-in may not either: the
    net arms all the same (its check is then not kept out of tracing: there is no tracer), its
    flush runs, and it imports nothing the application did not."""
    import types

    import torch

    import te_offload_shim
    from te_offload_shim.engine import net
    from te_offload_shim.integrations import flush

    assert "torch._dynamo" not in sys.modules, "precondition: torch imported without TorchDynamo"

    class Base(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()

    module = types.ModuleType("no_dynamo")
    module.Base = Base  # type: ignore[attr-defined]
    assert net.arm(module, "Base", flush.FLUSHES, te_ready=False) == "armed"
    torch.cuda.empty_cache()
    assert te_offload_shim.stats()["net"]["flushes"] == 1, "the net saw the flush"
    assert "torch._dynamo" not in sys.modules


@pytest.mark.subprocess(env=NO_TABLE)
def test_with_no_flush_function_to_wrap_the_nets_row_says_so() -> None:
    """Flush attributes that are no functions (an application's or a stand-in's setting) are not
    wrapped: the net is not armed, and its row says why."""
    import torch
    from support import net_case

    import te_offload_shim

    net_case.install_device()
    torch.cuda.empty_cache = torch.cuda.memory.empty_cache = "off"  # type: ignore[assignment]
    net_case.load()
    assert torch.cuda.empty_cache == vars(torch.cuda.memory)["empty_cache"] == "off"
    row = te_offload_shim.status()["net"]
    assert (row["state"], row["detail"]) == (
        "error",
        "no flush function to wrap: torch.cuda.empty_cache, torch.cuda.memory.empty_cache",
    ), row


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"})
def test_a_flush_after_a_table_target_cleared_finds_nothing_and_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import torch
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    net_case.use_targets()
    import shim_targets

    layer = net_case.cached_linear(te)
    shim_targets.offload([layer])  # the table clears (and, like any offload, the weights then leave)
    net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert te_offload_shim.stats()["entries"] == 1
    net = te_offload_shim.stats()["net"]
    assert net["flushes"] == 1 and net["cleared_flushes"] == 0 and net["entries"] == 0
    assert _net_records(caplog) == []


@pytest.mark.subprocess(env=NO_TABLE)
def test_layers_built_before_the_shim_are_found_and_none_is_kept_alive() -> None:
    import gc
    import weakref

    import torch
    from support import net_case

    te = net_case.load()
    early = [net_case.cached_linear(te, seed) for seed in range(2)]
    import te_offload_shim  # after TE: the net arms now, and finds the layers built already

    net = te_offload_shim.status()["net"]
    assert net["state"] == "armed" and net["found_at_arming"] == 2 == net["live_layers"]
    late = net_case.cached_linear(te, 5)
    for layer in [*early, late]:
        net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert [net_case.entries(layer) for layer in [*early, late]] == [0, 0, 0]
    refs = [weakref.ref(layer) for layer in [*early, late]]
    del early, late, layer
    gc.collect()
    assert all(ref() is None for ref in refs), "the net keeps no layer alive"
    assert te_offload_shim.status()["net"]["live_layers"] == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_cuda_graphed_layers_are_left_alone_by_their_own_marks() -> None:
    import types

    import torch
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    by_config, by_te_mark, plain = (net_case.cached_linear(te, seed) for seed in range(3))
    # Megatron's TE wrappers keep their TransformerConfig on the layer (`self.config = config`)
    by_config.config = types.SimpleNamespace(cuda_graph_impl="transformer_engine")
    # what TE's make_graphed_callables leaves on a module: a `forward` of TE's graph module
    graph_globals = {"__name__": "transformer_engine.pytorch.graph"}
    by_te_mark.forward = types.FunctionType(compile("def new_fwd(): pass", "graph", "exec").co_consts[0], graph_globals)
    for layer in (by_config, by_te_mark, plain):
        net_case.offload_like_megatron(layer)
    torch.cuda.empty_cache()
    assert (net_case.entries(by_config), net_case.entries(by_te_mark), net_case.entries(plain)) == (1, 1, 0)
    assert te_offload_shim.stats()["net"]["skipped"] == 2


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_failing_net_warns_once_and_the_flush_runs_and_strict_mode_raises(caplog: pytest.LogCaptureFixture) -> None:
    import os

    import torch
    from support import net_case

    import te_offload_shim
    from te_offload_shim.te import caches

    _layer, calls = net_case.offloaded_under_a_recording_flush()  # held: the net knows it by a weak reference
    errors = [RuntimeError("the net's own bug"), RuntimeError("the net's own bug"), ValueError("another bug")]

    def broken(layers: list[Any], **_: Any) -> Any:
        raise errors.pop(0) if errors else RuntimeError("the net's own bug")

    caches.clear_layers = broken  # type: ignore[assignment]
    assert [_cuda().empty_cache() for _ in range(3)] == ["flushed"] * 3
    assert calls == [1, 1, 1]
    assert [r.getMessage() for r in caplog.records if "flush net failed" in r.getMessage()] == [
        "the flush net failed (RuntimeError: the net's own bug); the flush goes on without it",
        "the flush net failed (ValueError: another bug); the flush goes on without it",
    ], "once per kind of failure"
    assert te_offload_shim.stats()["net"]["errors"] == 3
    os.environ["TE_OFFLOAD_SHIM_STRICT"] = "1"
    with pytest.raises(RuntimeError, match="the net's own bug"):
        torch.cuda.empty_cache()


@pytest.mark.subprocess(env=NO_TABLE)
def test_in_strict_mode_a_cache_the_net_cannot_read_raises_out_of_the_flush_once_it_is_cleared() -> None:
    """Strict mode (`TE_OFFLOAD_SHIM_STRICT=1`, read at each flush) reaches the net's clearing: an
    entry it cannot account for raises `ShimError` out of the flush once the layer is cleared;
    without strict mode the same flush clears, warns and runs."""
    import os

    import torch
    from support import net_case

    from te_offload_shim.te.caches import ShimError

    class Unreadable:
        """A workspace value whose accounting raises (a TE class from a future release, say)."""

        @property
        def _data(self) -> Any:
            raise RuntimeError("unreadable")

    layer, calls = net_case.offloaded_under_a_recording_flush()
    layer._fp8_workspaces["weight"] = Unreadable()
    assert _cuda().empty_cache() == "flushed" and layer._fp8_workspaces == {}
    layer._fp8_workspaces["weight"] = Unreadable()
    os.environ["TE_OFFLOAD_SHIM_STRICT"] = "1"
    with pytest.raises(ShimError, match="unreadable"):
        torch.cuda.empty_cache()
    assert layer._fp8_workspaces == {} and calls == [1], "cleared first; the flush itself did not run"


@pytest.mark.subprocess(env=NO_TABLE)
def test_the_applications_signal_handler_exception_during_the_nets_clearing_reaches_the_flushs_caller() -> None:
    """The net follows the fail-open rule (`_log.fail_open`, guarantee 34): a timeout the
    application's SIGALRM handler raises while the net clears is the application's, not the net's
    failure to swallow: it reaches the caller of the flush unchanged, and is not counted."""
    import signal

    from support import net_case

    import te_offload_shim
    from te_offload_shim.te import caches

    class StepTimeout(Exception):
        pass

    def timeout(signum: int, frame: Any) -> None:
        raise StepTimeout("step 7 took too long")

    layer, calls = net_case.offloaded_under_a_recording_flush()
    clear_layers = caches.clear_layers

    def alarmed(layers: list[Any], **kwargs: Any) -> Any:
        signal.raise_signal(signal.SIGALRM)  # the handler runs here, inside the net's clearing
        return clear_layers(layers, **kwargs)

    caches.clear_layers = alarmed  # type: ignore[assignment]
    signal.signal(signal.SIGALRM, timeout)
    try:
        with pytest.raises(StepTimeout, match="step 7"):
            _cuda().empty_cache()
    finally:
        caches.clear_layers = clear_layers  # type: ignore[assignment]
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert te_offload_shim.stats()["net"]["errors"] == 0, "the application's timeout counted as the net's failure"
    assert _cuda().empty_cache() == "flushed" and calls == [1], "the next flush, without an alarm, runs as before"
    assert net_case.entries(layer) == 0, "and the net clears the layer there"


@pytest.mark.subprocess(env={**NO_TABLE, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531", "RANK": "0"})
def test_a_reshard_of_torchs_fsdp_is_never_taken_for_an_offload() -> None:
    """torch's FSDP1 on the CPU (gloo, world size 1) around TE's layer: its parameters carry FSDP's
    own mark, so flushes between microbatches clear nothing, nor after FSDP's own `_free_storage`
    frees the flat parameter as a reshard does (at world size 1 FSDP does not reshard by itself)."""
    import torch
    import torch.distributed as dist
    from support import net_case
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.utils import _free_storage

    import te_offload_shim

    te = net_case.load()
    dist.init_process_group("gloo", world_size=1, rank=0)
    try:
        for use_orig_params in (False, True):
            layer = te.Linear(net_case.HIDDEN, net_case.HIDDEN, params_dtype=torch.float32)
            wrapped = FullyShardedDataParallel(layer, device_id=torch.device("cpu"), use_orig_params=use_orig_params)
            for microbatch in range(2):
                net_case.forward(wrapped, is_first_microbatch=microbatch == 0)
                torch.cuda.empty_cache()
            assert net_case.entries(layer) == 1
            for param in wrapped.parameters():
                _free_storage(param.data)  # the state a reshard leaves: the flat parameter's storage freed
            assert all(p.untyped_storage().nbytes() == 0 for p in layer.parameters())
            torch.cuda.empty_cache()
            assert net_case.entries(layer) == 1, f"use_orig_params={use_orig_params}: a reshard is no offload"
    finally:
        dist.destroy_process_group()
    assert te_offload_shim.stats()["net"]["cleared_flushes"] == 0


@pytest.mark.subprocess(env=NO_TABLE)
def test_an_fp8_primary_weight_counts_by_the_bytes_of_its_inner_data() -> None:
    """TE's own Float8Tensor parameter (`fp8_model_init`): a tensor subclass whose bytes live in its
    inner `_data`; on the device while that holds bytes, off once its storage is freed."""
    import torch
    from support import net_case
    from support.placement import offloaded

    from harness import te_twin
    from te_offload_shim.te import placement

    te = net_case.load()
    with te_twin.model_init():
        layer = te.Linear(net_case.HIDDEN, net_case.HIDDEN, params_dtype=torch.float32)
    assert type(layer.weight).__name__ == "Float8Tensor"
    assert placement.on_device(layer.weight) and offloaded([layer]) == []
    layer.weight._data.untyped_storage().resize_(0)
    assert not placement.on_device(layer.weight)
    assert offloaded([layer]) == [], "the bias still holds bytes: half on the device"
    layer.bias.data.untyped_storage().resize_(0)
    assert offloaded([layer]) == [layer]


@pytest.mark.subprocess(env=NO_TABLE)
def test_fp8_primary_weights_transposes_cleared_by_the_net_are_counted_logged_and_shown(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """TE 2.20.2's own `Linear` under `quantized_model_init` (delayed scaling): no workspace entry,
    the weight's transpose is what the net frees at the offload's flush. It is counted (a cleared
    flush, its bytes in `primary_weight_cleared` of `status()["net"]` and `stats()["net"]`), the
    first clearing logged once with its caller, and shown in `te-offload-shim status`. The net off
    (`TE_OFFLOAD_SHIM_NET=0`) keeps the transposes: the baseline."""
    from support import net_case

    import te_offload_shim
    from te_offload_shim import cli

    te = net_case.load()

    caplog.set_level(logging.INFO, logger="te_offload_shim")

    def offloaded() -> Any:
        layer = net_case.fp8_primary_linear(te)
        layer.weight._data.untyped_storage().resize_(0)  # megatron-core's buffer offload of an FP8 weight
        layer.bias.data.untyped_storage().resize_(0)
        return layer

    os.environ["TE_OFFLOAD_SHIM_NET"] = "0"
    layer = offloaded()
    _flush_from_an_unknown_offload()
    assert layer.weight._transpose is not None, "the net off keeps the transpose"
    del os.environ["TE_OFFLOAD_SHIM_NET"]
    layer = offloaded()
    transpose = layer.weight._transpose.untyped_storage().nbytes()
    _flush_from_an_unknown_offload()
    assert layer.weight._transpose is None, "the net dropped the transpose"

    net = te_offload_shim.stats()["net"]
    assert (net["cleared_flushes"], net["entries"], net["primary_weight_cleared"]) == (1, 0, transpose), net
    row = te_offload_shim.status()["net"]
    assert row["primary_weight_cleared"] == transpose and row["cleared_flushes"] == 1, row
    line = _flush_from_an_unknown_offload.__code__.co_firstlineno + 3
    assert row["callers"] == [f"{__file__}:{line} in _flush_from_an_unknown_offload"], row
    said = _net_records(caplog)
    assert len(said) == 1 and said[0].getMessage().endswith(
        "an offload the target table does not know left the transposes of FP8 primary "
        f"weights ({transpose / 1024:.2f} KiB); cleared at torch.cuda.empty_cache called from {row['callers'][0]}"
    ), [r.getMessage() for r in said]
    capsys.readouterr()
    cli.main(["status"])
    printed = [text for text in capsys.readouterr().out.splitlines() if text.startswith("flush net:")]
    assert len(printed) == 1 and f"FP8 primary weights' transposes dropped ({transpose / 1024:.2f} KiB)" in printed[0]


@pytest.mark.subprocess(verl="0.8.0", env={"TE_OFFLOAD_SHIM_NET": "0"})
def test_fp8_primary_weights_transposes_cleared_by_a_table_target_are_counted_logged_and_written(
    caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """The table's twin of the test above: TE 2.20.2's own `Linear` under `quantized_model_init`,
    offloaded by verl 0.8.0's own `offload_megatron_model_to_cpu` (the table's `verl` row; the net
    off, so the table alone clears). What its clearing drops (the weight's transpose: no workspace
    entry) counts as the net's does: a cleared call, its bytes in `primary_weight_cleared` of
    `stats()` (the table's totals and the target's), of the target's `status()` row, the first line
    said once, and the stats file written at once (not only at exit). The row switched off at run
    time (`TE_OFFLOAD_SHIM_DISABLE=verl`) keeps the transposes: the baseline."""
    import json

    from support import net_case

    import te_offload_shim

    te = net_case.load()
    from verl.utils import megatron_utils

    caplog.set_level(logging.INFO, logger="te_offload_shim")
    stats_file = tmp_path / "stats-{pid}.json"
    os.environ["TE_OFFLOAD_SHIM_STATS"] = str(stats_file)
    written = tmp_path / f"stats-{os.getpid()}.json"

    os.environ["TE_OFFLOAD_SHIM_DISABLE"] = "verl"
    layer = net_case.fp8_primary_linear(te)
    megatron_utils.offload_megatron_model_to_cpu([layer])
    assert layer.weight._transpose is not None, "the row switched off keeps the transpose"
    assert not written.exists(), "nothing cleared, nothing written"
    del os.environ["TE_OFFLOAD_SHIM_DISABLE"]
    layer = net_case.fp8_primary_linear(te)
    transpose = layer.weight._transpose.untyped_storage().nbytes()
    megatron_utils.offload_megatron_model_to_cpu([layer])
    assert layer.weight._transpose is None, "the table's clearing dropped the transpose"

    stats = te_offload_shim.stats()
    assert (stats["calls"], stats["cleared_calls"], stats["entries"]) == (1, 1, 0), "a call switched off is no call"
    assert stats["primary_weight_cleared"] == transpose > 0, stats
    assert stats["by_target"]["verl"]["primary_weight_cleared"] == transpose, stats["by_target"]
    row = next(r for r in te_offload_shim.status()["targets"] if r["name"] == "verl")
    assert row["state"] == "patched" and row["primary_weight_cleared"] == transpose, row
    said = [r for r in caplog.records if "transposes of FP8 primary weights" in r.getMessage()]
    assert len(said) == 1 and said[0].getMessage().endswith(
        f"offload_megatron_model_to_cpu: dropped the transposes of FP8 primary weights ({transpose / 1024:.2f} KiB) "
        "before the flush"
    ), [r.getMessage() for r in said]
    on_disk = json.loads(written.read_text())
    assert (on_disk["cleared_calls"], on_disk["primary_weight_cleared"]) == (1, transpose), on_disk
    del os.environ["TE_OFFLOAD_SHIM_STATS"]

    # a call that clears both, a workspace entry and a transpose, says both in its one line
    from te_offload_shim._log import human_bytes

    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    both = [net_case.fp8_primary_linear(te), net_case.cached_linear(te, 1)]
    transpose, held = both[0].weight._transpose.untyped_storage().nbytes(), stats["bytes"]
    megatron_utils.offload_megatron_model_to_cpu(both)
    held = te_offload_shim.stats()["bytes"] - held
    both_said = [r.getMessage() for r in caplog.records if "and dropped" in r.getMessage()]
    assert len(both_said) == 1 and both_said[0].endswith(
        f"offload_megatron_model_to_cpu: cleared 1 FP8 weight workspaces in 1 modules ({human_bytes(held)} held) and "
        f"dropped the transposes of FP8 primary weights ({transpose / 1024:.2f} KiB) before the flush"
    ), both_said


@pytest.mark.subprocess(env=NO_TABLE)
def test_the_checks_one_look_covers_tes_quantized_parameters() -> None:
    """At a flush with nothing to clear, a layer whose weights are TE's quantized parameters (FP8
    primary weights: Float8Tensor, Float8BlockwiseQTensor) is settled by one look at its weight's inner data,
    as a plain parameter is, never by reading all its parameters (`_decide`); a tensor subclass
    that is not TE's always takes the full reading; every answer is the full reading's."""
    import torch
    from support import net_case
    from support.placement import Held

    from harness import te_twin
    from te_offload_shim.te import placement

    te = net_case.load()
    from transformer_engine.common.recipe import DelayedScaling, Float8BlockScaling

    built = []
    for recipe in (DelayedScaling(), Float8BlockScaling()):
        with te_twin.model_init(recipe):
            built.append(te.Linear(net_case.HIDDEN, net_case.HIDDEN, params_dtype=torch.float32))
    assert [type(layer.weight).__name__ for layer in built] == ["Float8Tensor", "Float8BlockwiseQTensor"]

    class Foreign(torch.Tensor):  # a subclass not TE's, holding its bytes itself
        pass

    foreign = torch.nn.Linear(4, 4)
    foreign.weight = torch.nn.Parameter(torch.ones(4, 4).as_subclass(Foreign))
    entries = [Held(layer) for layer in (*built, foreign)]
    full = placement._decide
    read: list[Any] = []

    def counted(layer: Any, is_device: str) -> tuple[bool, str | None, str | None]:
        read.append(layer)
        return full(layer, is_device)

    placement._decide = counted  # type: ignore[assignment]
    try:
        for _ in range(3):
            assert placement.offloaded_entries(entries) == []
        # the TE layers once each, at the first flush (their types learnt); the foreign one at every flush
        assert read == [*built, foreign, foreign, foreign], read
        read.clear()
        for layer in built:
            for name in placement.QUANTIZED_DATA:
                if getattr(layer.weight, name, None) is not None:
                    getattr(layer.weight, name).untyped_storage().resize_(0)
            layer.bias.data.untyped_storage().resize_(0)
        assert placement.offloaded_entries(entries) == built, "off: the full reading decides, for each layer"
        assert read == [*built, foreign], read
    finally:
        placement._decide = full  # type: ignore[assignment]


def test_a_layer_dying_after_the_registrys_globals_are_torn_down_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter shutdown a module's globals are set to None before the last objects die: a
    layer's weak reference callback then still finds the registry it was made for (before, it raised
    AttributeError on None, which the interpreter prints as "Exception ignored" once per layer)."""
    import torch

    from te_offload_shim.te import layers

    layer = torch.nn.Linear(2, 2)
    layers.note(layer)
    kept = layers._refs
    assert id(layer) in kept
    monkeypatch.setattr(layers, "_refs", None)  # what teardown leaves
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    del layer
    assert unraisable == [], "the callback raised"
    monkeypatch.undo()
    assert all(ref() is not None for ref in kept.values()), "the dead layer's reference left the registry"


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_flush_called_from_c_with_no_python_caller_names_its_caller_unknown(caplog: pytest.LogCaptureFixture) -> None:
    """A flush with no Python frame above the net's own (called from C: here the function itself
    started as a thread by `_thread.start_new_thread`) clears as any other and says its caller is
    `<unknown>`, in the log line and in the status row."""
    import _thread
    import time

    import torch
    from support import net_case

    import te_offload_shim

    te = net_case.load()
    caplog.set_level(logging.INFO, logger="te_offload_shim")
    layer = net_case.cached_linear(te)
    net_case.offload_like_megatron(layer)
    _thread.start_new_thread(torch.cuda.empty_cache, ())
    deadline = time.monotonic() + 10
    while te_offload_shim.stats()["net"]["cleared_flushes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert net_case.entries(layer) == 0
    assert te_offload_shim.status()["net"]["callers"] == ["<unknown>"]
    said = _net_records(caplog)
    assert len(said) == 1 and said[0].getMessage().endswith("called from <unknown>"), [r.getMessage() for r in said]


@pytest.mark.subprocess(env=NO_TABLE)
def test_a_net_clearing_of_caches_and_primary_weights_transposes_says_both(caplog: pytest.LogCaptureFixture) -> None:
    """One flush frees a layer's workspace entry and another layer's FP8 primary weight transpose:
    its one line says both, the caches and the transposes."""
    from support import net_case

    import te_offload_shim  # noqa: F401  (installs: the net arms when TE is imported)

    te = net_case.load()
    caplog.set_level(logging.INFO, logger="te_offload_shim")
    cached, primary = net_case.cached_linear(te), net_case.fp8_primary_linear(te)
    net_case.offload_like_megatron(cached)
    primary.weight._data.untyped_storage().resize_(0)  # megatron-core's buffer offload of an FP8 weight
    primary.bias.data.untyped_storage().resize_(0)
    transpose = primary.weight._transpose.untyped_storage().nbytes()
    _flush_from_an_unknown_offload()
    assert net_case.entries(cached) == 0 and primary.weight._transpose is None
    said = _net_records(caplog)
    assert len(said) == 1, [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert "left 1 FP8 weight caches (" in message, message
    assert " in 1 layers and the transposes of FP8 primary weights " in message, message
    assert f"({transpose / 1024:.2f} KiB); cleared at torch.cuda.empty_cache" in message, message
