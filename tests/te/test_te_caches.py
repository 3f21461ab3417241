"""The clearing logic on TE's cache layouts: stand-in values (harness/te_standins.py), real megatron.

Byte counts are checked against an oracle that lists each stand-in's tensors
(`te_standins.inner_tensors`), not against the code under test. TE's own classes, release by release,
are in tests/te/test_te_real.py.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import pytest
import torch

import te_offload_shim as shim
from harness import te_standins as te
from te_offload_shim.te import sizes as te_bytes
from te_offload_shim.te.caches import ShimError, clear_fp8_workspaces, scan

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")


def oracle_bytes(values: list[Any]) -> int:
    storages: dict[int, int] = {}
    for value in values:
        for t in te.inner_tensors(value):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def weight(rows: int = 64, cols: int = 32) -> torch.Tensor:
    return torch.randn(rows, cols)


# TE's real classes of every release are checked in tests/te/test_te_real.py; these are the stand-ins
# other tests use (harness/te_standins.py says why they remain).
VALUE_FACTORIES = {
    "1.x Float8Tensor": lambda w: te.Float8TensorV1(w),
    "2.x Float8Tensor": te.Float8TensorV2,
    "2.3+ Float8BlockwiseQTensor": te.Float8BlockwiseQTensorV2,
}


@pytest.mark.parametrize("layout", list(VALUE_FACTORIES))
def test_each_value_layout_is_counted_exactly_and_cleared(layout: str) -> None:
    layer = te.TELinearStandIn(64, 32)
    value = VALUE_FACTORIES[layout](layer.weight.detach())
    te.attach_workspaces(layer, {"weight": value})
    expected = oracle_bytes([value])
    assert expected > 0

    seen = scan([layer])
    assert (seen.entries, seen.modules, seen.bytes, seen.cleared) == (1, 1, expected, False)
    assert layer._fp8_workspaces == {"weight": value}, "scan changes nothing"

    report = clear_fp8_workspaces([layer])
    assert (report.entries, report.modules, report.bytes) == (1, 1, expected)
    assert layer._fp8_workspaces == {} and type(layer.__dict__["_fp8_workspaces"]) is dict
    assert report.released_bytes is None, "CUDA is not initialised here: nothing measured, nothing claimed"


def test_wrapper_tensors_own_no_bytes_so_inner_tensors_are_what_count() -> None:
    """TE's QuantizedTensor wrappers report an empty storage (by design from TE 2.16): counting the
    wrapper instead of its inner tensors would say zero."""
    value = te.Float8TensorV2(weight())
    with pytest.raises(RuntimeError, match="invalid python storage"):
        value.untyped_storage().data_ptr()
    assert sum(te_bytes.storages([value], torch).values()) == oracle_bytes([value]) > 0


def test_module_kinds_and_their_keys() -> None:
    """Linear "weight"; LayerNormMLP "fc1_weight"/"fc2_weight"; GroupedLinear "weight0".."weightN-1"."""
    linear = te.TELinearStandIn(32, 16)
    te.fill_like_forward(linear)
    mlp: Any = torch.nn.Module()  # Any: nn.Module types `mlp._fp8_workspaces` as `Tensor | Module`
    mlp.fc1_weight = torch.nn.Parameter(weight(64, 16))
    mlp.fc2_weight = torch.nn.Parameter(weight(16, 64))
    te.attach_workspaces(
        mlp, {"fc1_weight": te.Float8TensorV2(mlp.fc1_weight), "fc2_weight": te.Float8TensorV2(mlp.fc2_weight)}
    )
    grouped = te.GroupedLinearStandIn(experts=8, rows=16, cols=16)
    te.fill_like_forward(grouped, te.Float8BlockwiseQTensorV2)
    model = torch.nn.Sequential(linear, mlp, grouped, torch.nn.LayerNorm(16))
    values = [*linear._fp8_workspaces.values(), *mlp._fp8_workspaces.values(), *grouped._fp8_workspaces.values()]
    expected = oracle_bytes(values)
    del values

    report = clear_fp8_workspaces(model)
    assert (report.entries, report.modules, report.bytes) == (1 + 2 + 8, 3, expected)
    assert not linear._fp8_workspaces and not mlp._fp8_workspaces and not grouped._fp8_workspaces


def test_storages_shared_between_entries_are_counted_once() -> None:
    layer = te.TELinearStandIn(64, 32)
    shared_attrs: dict[str, Any] = {}
    a = te.Float8TensorV1(layer.weight.detach(), fp8_attrs=shared_attrs)  # 1.x shares scale_inv via _fp8_attrs
    b = te.Float8TensorV1(layer.weight.detach() * 2, fp8_attrs=shared_attrs)
    te.attach_workspaces(layer, {"weight": a, "alias": a, "other": b})
    expected = oracle_bytes([a, b])
    naive = sum(t.untyped_storage().nbytes() for v in (a, a, b) for t in te.inner_tensors(v))
    assert expected < naive
    assert clear_fp8_workspaces(layer).bytes == expected


def test_storage_shared_with_a_parameter_is_not_counted_as_freed() -> None:
    layer = te.TELinearStandIn(64, 32)
    value = te.Float8TensorV2(layer.weight.detach())
    value._scale_inv = layer.weight.data  # the entry holds the parameter's own storage
    te.attach_workspaces(layer, {"weight": value})
    param_bytes = layer.weight.untyped_storage().nbytes()
    report = clear_fp8_workspaces(layer)
    assert report.bytes_shared == param_bytes
    assert report.bytes == oracle_bytes([value]) - param_bytes


def test_legacy_layout_is_left_byte_for_byte_and_reported() -> None:
    """TE 1.0 - 1.7: clearing is unsafe (module/base.py v1.7 set_fp8_weights re-creates an
    uninitialised buffer that a forward with is_first_microbatch=False uses unfilled)."""
    mlp = torch.nn.Module()
    w1, w2 = weight(64, 16), weight(16, 64)
    te.attach_legacy(mlp, [w1, w2])
    before = {k: v for k, v in mlp.__dict__.items() if k.startswith("weight")}
    data_before = {k: v._data.clone() for k, v in before.items()}
    report = clear_fp8_workspaces(torch.nn.Sequential(mlp))
    assert report.entries == 0 and report.bytes == 0
    (skipped,) = report.skipped
    assert "TE < 1.8" in skipped.reason and skipped.entries == 4
    assert skipped.bytes == oracle_bytes(list(before.values()))
    assert skipped.where == "chunk0.0"
    after = {k: v for k, v in mlp.__dict__.items() if k.startswith("weight")}
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert all(torch.equal(after[k]._data, data_before[k]) for k in before)


def _graph_config(**kwargs: Any) -> Any:
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True, **kwargs)


def _chunk_with_cache() -> Any:
    """Sequential(Sequential(a cached TE layer)). Typed Any: the tests index into it and hang megatron's
    attributes on it (config, cuda_graphs), which nn.Module's types (`Tensor | Module`) do not allow."""
    layer = te.TELinearStandIn(16, 16)
    te.fill_like_forward(layer)
    return torch.nn.Sequential(torch.nn.Sequential(layer))


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"cuda_graph_impl": "local"}, "cuda_graph_impl='local'"),
        ({"cuda_graph_impl": "transformer_engine"}, "cuda_graph_impl='transformer_engine'"),
        ({"enable_cuda_graph": True}, "cuda_graph_impl='local'"),  # megatron >= 0.15 maps the old flag
        ({"external_cuda_graph": True}, "cuda_graph_impl='transformer_engine'"),
    ],
)
def test_cuda_graph_configs_are_refused(config: dict, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    outer = _chunk_with_cache()
    outer.config = _graph_config(**config)  # like megatron DDP / Float16Module / GPTModel carry it
    with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
        report = shim.clear_fp8_workspaces([outer])
        shim.clear_fp8_workspaces([outer])
    assert report.entries == 0 and report.skipped[0].reason == f"CUDA graphs: config.{reason}"
    assert report.skipped[0].entries == 1
    assert outer[0][0]._fp8_workspaces, "nothing cleared"
    assert sum("CUDA graphs are on" in r.message for r in caplog.records) <= 1


def test_cuda_graph_config_on_an_inner_wrapper_is_refused() -> None:
    """DDP(Float16Module(GPTModel)): the config may sit on any `.module` level."""
    inner = _chunk_with_cache()
    inner.config = _graph_config(cuda_graph_impl="local")
    wrapper = torch.nn.Module()
    wrapper.module = inner
    assert shim.clear_fp8_workspaces([wrapper]).entries == 0


def test_old_megatron_flags_without_cuda_graph_impl_are_refused() -> None:
    outer = _chunk_with_cache()
    outer.config = type("OldConfig", (), {"enable_cuda_graph": True, "external_cuda_graph": False})()
    assert shim.clear_fp8_workspaces([outer]).skipped[0].reason == "CUDA graphs: config.enable_cuda_graph=True"


@pytest.mark.parametrize("marker", ["cudagraph_manager", "cuda_graphs"])
def test_cuda_graph_module_markers_are_refused(marker: str) -> None:
    chunk = _chunk_with_cache()
    layer_owner = chunk[0]
    if marker == "cudagraph_manager":
        layer_owner.cudagraph_manager = torch.nn.Module()  # megatron's CudaGraphManager is a submodule
    else:
        layer_owner.cuda_graphs = [object()]  # filled by TECudaGraphHelper once captured
    report = shim.clear_fp8_workspaces(chunk)
    assert report.entries == 0 and marker in report.skipped[0].reason


def test_empty_cuda_graphs_list_is_not_a_marker() -> None:
    chunk = _chunk_with_cache()
    chunk[0].cuda_graphs = []
    assert shim.clear_fp8_workspaces(chunk).entries == 1


def test_force_switch_clears_despite_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    outer = _chunk_with_cache()
    outer.config = _graph_config(cuda_graph_impl="local")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_FORCE_CUDA_GRAPHS", "1")
    assert shim.clear_fp8_workspaces([outer]).entries == 1


class _BrokenValue:
    """A value whose accounting raises: a TE class from a future release, say."""

    _data = property(lambda self: (_ for _ in ()).throw(RuntimeError("unreadable")))


def test_value_whose_accounting_raises_is_still_cleared(caplog: pytest.LogCaptureFixture) -> None:
    layer = te.TELinearStandIn(16, 16)
    te.attach_workspaces(layer, {"weight": _BrokenValue()})
    with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
        report = clear_fp8_workspaces(layer, strict=False)
    assert report.entries == 1 and layer._fp8_workspaces == {}
    assert report.errors and "unreadable" in report.errors[0]


def test_value_whose_accounting_raises_raises_in_strict_mode_after_clearing() -> None:
    layer = te.TELinearStandIn(16, 16)
    te.attach_workspaces(layer, {"weight": _BrokenValue()})
    with pytest.raises(ShimError, match="unreadable"):
        clear_fp8_workspaces(layer, strict=True)
    assert layer._fp8_workspaces == {}


def test_the_applications_signal_handler_exception_during_accounting_reaches_it_unreported() -> None:
    """te/ follows the fail-open rule too (`_log.fail_open`, guarantee 34): a timeout the
    application's signal handler raises while the clearing counts bytes is the application's, not
    a value that cannot be counted: it goes on, the very object; the caches are cleared already."""
    import signal

    class StepTimeout(Exception):
        pass

    def timeout(signum: int, frame: object) -> None:
        raise StepTimeout("step 7 took too long")

    class Alarmed:
        _data = property(lambda self: signal.raise_signal(signal.SIGALRM))

    layer = te.TELinearStandIn(16, 16)
    te.attach_workspaces(layer, {"weight": Alarmed()})
    old = signal.signal(signal.SIGALRM, timeout)
    try:
        with pytest.raises(StepTimeout, match="step 7"):
            clear_fp8_workspaces(layer, strict=False)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert layer._fp8_workspaces == {}


@pytest.mark.subprocess()
def test_module_names_are_loaded_only_when_a_record_needs_one() -> None:
    """te/names.py (the parent links that name a module in a record) is loaded by the first record a
    clearing makes, never by a clearing that meets nothing odd (what a training process loads)."""
    layer = te.TELinearStandIn(8, 8)
    te.fill_like_forward(layer)
    assert clear_fp8_workspaces(torch.nn.Sequential(layer)).entries == 1
    assert "te_offload_shim.te.names" not in sys.modules
    inner = te.TELinearStandIn(8, 8)
    inner.__dict__["_fp8_workspaces"] = ["not", "a", "dict"]
    odd = torch.nn.Sequential(torch.nn.Sequential(inner))
    assert [s.where for s in clear_fp8_workspaces(odd).skipped] == ["chunk0.0.0"]
    assert "te_offload_shim.te.names" in sys.modules


def test_non_dict_workspaces_are_skipped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    layers = [te.TELinearStandIn(8, 8) for _ in range(3)]
    for layer in layers:
        layer.__dict__["_fp8_workspaces"] = ["not", "a", "dict"]
    with caplog.at_level(logging.WARNING, logger="te_offload_shim"):
        report = clear_fp8_workspaces(layers, strict=True)  # a layout we do not know is not an error
    assert report.entries == 0 and len(report.skipped) == 3
    assert all("not a dict" in s.reason for s in report.skipped)
    assert sum("not a dict" in r.getMessage() for r in caplog.records) == 1
    assert all(layer._fp8_workspaces == ["not", "a", "dict"] for layer in layers)


class _RaisingDict(dict):
    def values(self):  # type: ignore[override]
        raise RuntimeError("values() exploded")


def test_dict_subclass_that_raises_is_skipped_and_others_still_cleared() -> None:
    bad, good = te.TELinearStandIn(8, 8), te.TELinearStandIn(8, 8)
    te.fill_like_forward(good)
    bad.__dict__["_fp8_workspaces"] = _RaisingDict(weight=te.Float8TensorV2(bad.weight))
    report = clear_fp8_workspaces([bad, good], strict=False)
    assert report.entries == 1 and not good._fp8_workspaces
    assert len(bad._fp8_workspaces) == 1
    assert "values() exploded" in report.skipped[0].reason
    with pytest.raises(ShimError):
        clear_fp8_workspaces([bad], strict=True)


def test_params_filter_clears_only_layers_owning_those_params() -> None:
    a, b = te.TELinearStandIn(8, 8), te.TELinearStandIn(8, 8)
    te.fill_like_forward(a)
    te.fill_like_forward(b)
    report = clear_fp8_workspaces(torch.nn.Sequential(a, b), params=[b.weight])
    assert report.entries == 1 and a._fp8_workspaces and not b._fp8_workspaces


@pytest.mark.parametrize("models", [None, [], (), [None, "not a module", 3]])
def test_nothing_to_clear(models: Any) -> None:
    report = clear_fp8_workspaces(models)
    assert (report.entries, report.bytes, report.skipped, report.errors) == (0, 0, [], [])


def test_generator_refused_and_single_module_and_shared_submodules() -> None:
    layer = te.TELinearStandIn(8, 8)
    te.fill_like_forward(layer)
    twice = torch.nn.Sequential(layer, layer)  # one module reachable twice is one module
    assert scan(twice).modules == 1
    refused = clear_fp8_workspaces(m for m in [twice])  # a generator is never iterated by the shim
    assert refused.entries == 0 and [s.where for s in refused.skipped] == ["models"]
    assert "one-shot iterator (generator)" in refused.skipped[0].reason and layer._fp8_workspaces
    assert clear_fp8_workspaces([twice]).entries == 1


def test_report_as_dict_round_trips_the_fields() -> None:
    mlp = torch.nn.Module()
    te.attach_legacy(mlp, [weight(8, 8)])
    d = scan(mlp).as_dict()
    assert d["cleared"] is False and d["skipped"][0]["entries"] == 2 and set(d) >= {"entries", "bytes", "modules"}


def test_legacy_module_that_cached_nothing_yields_no_record() -> None:
    """TE < 1.8 sets `fp8_weight_shapes` at construction; until a forward caches, there is nothing
    left in place, so nothing to report (it used to add a zero-entry "skipped" record per layer)."""
    cached, empty = torch.nn.Module(), torch.nn.Module()
    te.attach_legacy(cached, [weight(8, 8)])
    empty.__dict__["fp8_weight_shapes"] = [torch.Size([8, 8])]
    report = scan(torch.nn.Sequential(cached, empty))
    assert [s.where for s in report.skipped] == ["chunk0.0"] and report.skipped[0].entries == 2


def test_entry_aliasing_a_ddp_bucket_reports_its_own_bytes_not_the_bucket() -> None:
    """megatron DDP: parameters are views into one flat bucket. An entry that is a view into that
    bucket shares its storage with a parameter: nothing is freed, and what is shared is the entry's
    own bytes, not the whole bucket."""
    bucket = torch.zeros(1 << 16, dtype=torch.uint8)
    layer = te.TELinearStandIn(8, 8)
    layer.weight = torch.nn.Parameter(bucket[:256].view(torch.float32).view(8, 8), requires_grad=False)
    value = te.Float8TensorV2(torch.randn(8, 8))
    value._scale_inv = bucket[4096:4100].view(torch.float32)  # 4 bytes of the bucket, not the param's
    value._data = bucket[256:320]  # 64 bytes right after the parameter
    te.attach_workspaces(layer, {"weight": value})
    report = clear_fp8_workspaces(layer)
    assert report.bytes_shared == 64 + 4 < bucket.numel()
    assert report.bytes == value._transpose.untyped_storage().nbytes()


class _Keeper(logging.Handler):
    """A buffering handler (MemoryHandler-like): keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_logged_accounting_failure_keeps_no_popped_value_alive() -> None:
    """The warning carries repr(exc), not the exception: a handler that buffers records would
    otherwise hold the traceback, whose frames hold the popped cache values."""
    import gc
    import weakref

    from te_offload_shim import _log

    layer = te.TELinearStandIn(16, 16)
    value = _BrokenValue()
    alive = weakref.ref(value)
    te.attach_workspaces(layer, {"weight": value})
    del value
    keeper = _Keeper()
    logger = logging.getLogger("te_offload_shim")
    logger.addHandler(keeper)
    logger.setLevel(logging.WARNING)
    getattr(_log, "_warned", set()).clear()
    try:
        report = clear_fp8_workspaces(layer, strict=False)
    finally:
        logger.removeHandler(keeper)
    gc.collect()
    assert report.entries == 1 and report.errors
    assert any("unreadable" in r.getMessage() for r in keeper.records)
    assert all(not isinstance(a, BaseException) for r in keeper.records for a in (r.args or ()))
    assert alive() is None, "the popped value is still referenced"


def test_fp8_primary_weight_copy_bytes_reach_stats() -> None:
    """The surviving transpose / columnwise bytes of FP8 primary weights (counted on TE's real
    classes in tests/te/test_te_real.py) are in every report and in `stats()` (as seen at the last call)."""
    from types import SimpleNamespace

    from te_offload_shim.engine import handler as _offload
    from te_offload_shim.engine import stats

    report = scan(te.TELinearStandIn(8, 8))
    report.primary_weight_bytes, report.primary_weight_params = 4096, 2
    stats.reset()
    try:
        _offload._count_clearing(SimpleNamespace(name="user", path="mod:offload"), report)  # type: ignore[arg-type]
        assert stats.counts()["primary_weight_bytes"] == 4096
    finally:
        stats.reset()
    assert {"primary_weight_params", "primary_weight_bytes", "primary_weight_where"} <= set(report.as_dict())


class _PrimaryWeight(te.Float8TensorV2):
    """An FP8 primary weight with TE's `update_usage` contract (tensor/storage/float8_tensor_storage.py):
    `columnwise_usage=False` drops `_transpose`; nothing else, so the shim falls back to it (TE's real
    classes, and TE's own clear_columnwise_cache / remove_caches, are exercised in tests/te/test_te_real.py)."""

    def update_usage(self, rowwise_usage: Any = None, columnwise_usage: Any = None) -> None:
        if columnwise_usage is False:
            self._transpose = None


@pytest.mark.parametrize(
    ("release", "graphs", "dropped"), [("2.20.2", False, True), ("2.1.0", False, False), ("2.20.2", True, False)]
)
def test_fp8_primary_weight_transpose_dropped_only_where_te_rebuilds_it_and_never_under_graphs(
    release: str, graphs: bool, dropped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    monkeypatch.setitem(sys.modules, "transformer_engine", types.SimpleNamespace(__version__=release))
    layer = te.TELinearStandIn(8, 8)
    weight = _PrimaryWeight(torch.randn(8, 8))
    layer._parameters["weight"] = weight
    transpose_bytes = weight._transpose.untyped_storage().nbytes()
    chunk = torch.nn.Sequential(layer)
    if graphs:
        chunk[0].cuda_graphs = [object()]  # type: ignore[assignment]  # torch types Module attributes Tensor | Module
    report = shim.clear_fp8_workspaces(chunk, strict=True)
    assert report.primary_weight_params == 1
    assert (weight._transpose is None) is dropped and weight._data is not None
    assert (report.primary_weight_cleared, report.primary_weight_bytes) == (
        (transpose_bytes, 0) if dropped else (0, transpose_bytes)
    )
    assert report.primary_weight_dropped_by == ("update_usage" if dropped else None)


def test_storage_shared_across_counting_passes_counts_once_and_the_collector_is_left_as_found() -> None:
    """The accounting counts `sizes.STEP` values per pass into one table: a storage that entries in
    two passes share counts once. The call turns the cyclic collector off while it runs, and must
    leave it as it found it, on or off."""
    import gc

    standins = [te.TELinearStandIn(4, 4) for _ in range(te_bytes.STEP + 8)]
    layers = torch.nn.ModuleList(standins)
    values = [te.Float8TensorV2(layer.weight.detach()) for layer in standins]
    values[-1]._scale_inv = values[0]._scale_inv  # first pass and last pass share one storage
    entries = [{"weight": value} for value in values]
    expected = oracle_bytes(values)
    assert expected < sum(t.untyped_storage().nbytes() for v in values for t in te.inner_tensors(v))
    for enabled in (True, False):
        for layer, entry in zip(layers, entries, strict=True):
            te.attach_workspaces(layer, entry)
        (gc.enable if enabled else gc.disable)()
        try:
            report = clear_fp8_workspaces([layers])
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
        assert (report.bytes, report.entries, report.bytes_shared) == (expected, len(values), 0)
