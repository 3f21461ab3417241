"""The residue report (`te_offload_shim.residue`) and the `TE_OFFLOAD_SHIM_AUDIT` line.

Models are built on the CPU and reported with `device_type="cpu"`, so every tensor counts; the
expected bytes are worked out by hand from the shapes and dtypes below, not by the code under test.
Heavy imports stay inside the functions: some tests here run in a fresh interpreter.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.set_up import missing

F32 = 4  # bytes per float32 element


def _model() -> tuple[Any, dict[str, int]]:
    """A module tree holding known tensors in every category, and the bytes each must report.
    The root is typed Any: it carries megatron-like attributes (a `buffers` list, plain objects)
    that nn.Module's types (`Tensor | Module` attributes) do not describe."""
    import torch

    from harness import te_standins as te

    class DDPBuffer:  # megatron `_ParamAndGradBuffer`'s fields (param_and_grad_buffer.py, core_v0.16.1)
        def __init__(self, n: int) -> None:
            self.param_data = torch.zeros(n)
            self.grad_data = torch.zeros(n)
            self.numel = n

    class Dispatcher:  # a plain object a module keeps state in (MoE token dispatchers do)
        pass

    root: Any = torch.nn.Module()
    root.buffers = [DDPBuffer(32)]  # megatron DDP's attribute: 2 x 32 float32
    lin = root.lin = torch.nn.Linear(4, 8)  # weight 32 + bias 8 float32
    lin.weight.grad = torch.ones(8, 4)  # 32 float32
    lin.weight.main_grad = torch.ones(8, 4, dtype=torch.float64)  # type: ignore[attr-defined]  # megatron's, 32 float64
    in_buffer = root.in_buffer = torch.nn.Linear(2, 4, bias=False)
    in_buffer.weight.data = root.buffers[0].param_data[:8].view(4, 2)  # a view into the DDP buffer
    in_buffer.weight.main_grad = root.buffers[0].grad_data[:8].view(4, 2)  # type: ignore[attr-defined]
    root.register_buffer("inv_freq", torch.ones(16))  # 16 float32
    layer = root.te = te.TELinearStandIn(16, 8)  # its float32 weight: 128 elements
    te.fill_like_forward(layer)  # Float8TensorV2 of 16x8: _data 128 + _transpose 128 + _scale_inv 4 bytes
    fp8 = root.fp8 = torch.nn.Module()  # an FP8 primary weight (fp8_model_init): 8x8
    fp8._parameters["weight"] = te.Float8TensorV2(torch.randn(8, 8))  # _data 64, _scale_inv 4 | _transpose 64
    legacy = root.legacy = torch.nn.Module()
    te.attach_legacy(legacy, [torch.randn(8, 8)])  # TE < 1.8: two Float8TensorV1 of 64 + 4 bytes each
    root.dispatcher = Dispatcher()
    root.dispatcher.tokens_per_expert = torch.ones(100)  # 100 float32
    root.dispatcher.state = Dispatcher()
    root.dispatcher.state.splits = torch.ones(10)  # 10 float32, two objects down
    root.cache = [torch.ones(5), torch.ones(5)]  # 2 x 5 float32
    root.lookup = {"probs": torch.ones(3)}  # 3 float32
    root.alias = lin.weight.detach()[:2]  # a view of a parameter: already counted
    root.twice = root.lin  # the same module registered twice: counted once
    expected = {
        "ddp_buffers": 2 * 32 * F32,
        "parameters": (32 + 8) * F32 + 128 * F32 + (64 + 4),
        "fp8_param_caches": 64,
        "gradients": 32 * F32 + 32 * 8,
        "buffers": 16 * F32,
        "fp8_workspaces": (128 + 128 + 4) + 2 * (64 + 4),
        "other": (100 + 10 + 10 + 3) * F32,
    }
    return root, expected


def test_every_category_exact_bytes_and_storages_counted_once() -> None:
    import te_offload_shim as shim

    root, expected = _model()
    report = shim.residue([root], device_type="cpu")
    assert report.errors == []
    assert report.by_category == expected
    assert report.total_bytes == sum(expected.values())
    assert report.other == {
        "dispatcher.tokens_per_expert": 400,
        "cache": 40,
        "dispatcher.state.splits": 40,
        "lookup.probs": 12,
    }
    assert list(report.other) == sorted(report.other, key=lambda k: -report.other[k]), "largest first"
    top = {(h.path, h.attribute): (h.category, h.bytes) for h in report.top}
    assert top[("chunk0", "dispatcher.tokens_per_expert")] == ("other", 400)
    assert top[("chunk0.te", "_fp8_workspaces[weight]")] == ("fp8_workspaces", 260)
    assert top[("chunk0.lin", "weight.main_grad")] == ("gradients", 256)
    assert top[("chunk0", "buffers[0].param_data")] == ("ddp_buffers", 128)
    assert (report.top[0].path, report.top[0].attribute, report.top[0].bytes) == ("chunk0.te", "weight", 128 * F32)
    assert [h.bytes for h in report.top] == sorted((h.bytes for h in report.top), reverse=True)
    assert len(report.top) == 10
    d = report.as_dict()
    assert d["by_category"] == expected and d["top"][0]["path"] == "chunk0.te"
    # Any device but the CPU (the default): on this machine nothing is there.
    assert shim.residue([root]).total_bytes == 0
    assert shim.residue(root, device_type="meta").total_bytes == 0


def test_nothing_moved_freed_or_kept_alive() -> None:
    import gc
    import weakref

    import torch

    import te_offload_shim as shim

    root, _ = _model()
    tensors = {
        n: t for n, t in root.state_dict(keep_vars=True).items() if type(t) is torch.Tensor or n.endswith("bias")
    }
    snapshot = {n: (t.data_ptr(), t.device, t.detach().clone()) for n, t in tensors.items()}
    entries = dict(root.te._fp8_workspaces)
    report = shim.residue([root], device_type="cpu")
    assert report.total_bytes > 0
    for name, (ptr, device, value) in snapshot.items():
        assert tensors[name].data_ptr() == ptr and tensors[name].device == device
        assert torch.equal(tensors[name], value)
    assert root.te._fp8_workspaces == entries, "the report clears nothing"
    refs = [weakref.ref(root), weakref.ref(root.lin.weight), weakref.ref(entries["weight"])]
    del root, tensors, entries, snapshot
    gc.collect()
    assert [r() for r in refs] == [None, None, None], "the report keeps no reference to what it counted"
    assert report.by_category["fp8_workspaces"] > 0  # the report itself is still there


def test_te_process_global_memory_is_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE's module globals, laid out as in TE 2.4 - 2.9 `module/base.py` (`_dummy_wgrads`,
    `_cublas_workspace`, `_multi_stream_cublas_workspace`, `_ub_communicators`) and 2.10+
    `cpp_extensions/gemm.py` (`get_cublas_workspace` under `functools.lru_cache`)."""
    import functools
    import sys
    import types

    import torch

    import te_offload_shim as shim

    base = types.ModuleType("transformer_engine.pytorch.module.base")
    base._dummy_wgrads = {(8, 8, torch.float32): torch.zeros(8, 8)}  # type: ignore[attr-defined]
    base._cublas_workspace = torch.empty(64, dtype=torch.uint8)  # type: ignore[attr-defined]
    base._multi_stream_cublas_workspace = [torch.empty(32, dtype=torch.uint8)]  # type: ignore[attr-defined]
    base._ub_communicators = {("qkv_fprop", None): object()}  # type: ignore[attr-defined]
    gemm = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")

    @functools.cache
    def get_cublas_workspace(device: int, ub: bool, grouped_gemm: bool) -> object:
        return [torch.empty(16, dtype=torch.uint8)] if grouped_gemm else torch.empty(8, dtype=torch.uint8)

    get_cublas_workspace(0, False, False)
    get_cublas_workspace(0, False, True)
    gemm.get_cublas_workspace = get_cublas_workspace  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.setitem(sys.modules, gemm.__name__, gemm)

    report = shim.residue([torch.nn.Linear(2, 2)], device_type="cpu")
    assert report.te_global == {"_dummy_wgrads": 64 * F32, "cublas_workspaces": 64 + 32 + 8 + 16, "userbuffers": None}
    assert report.total_bytes == (4 + 2) * F32, "TE's global memory is not the model's"
    assert get_cublas_workspace.cache_info().currsize == 2, "read, never called"
    assert "TE process-global: _dummy_wgrads 256 B" in report.summary()


def test_audit_fails_open_even_in_strict_mode(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch  # noqa: F401  # residue() takes torch from sys.modules: without it, nothing is inspected

    from te_offload_shim.engine import stats
    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations.targets import Target
    from te_offload_shim.reports import audit as audit

    class Exploding:
        def __iter__(self) -> object:
            raise RuntimeError("boom")

    class Owner:
        @property
        def model(self) -> object:
            raise RuntimeError("no model")

    import inspect

    def offload(self: object) -> None: ...

    monkeypatch.setenv("TE_OFFLOAD_SHIM_STRICT", "1")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", "cpu")
    target = Target("t", "m", "C.offload", "self.model")
    try:
        record = Record("target", Owner, "offload", offload, target=target.name)
        handler = Handler(target, inspect.signature(offload), "method", record)
        # the call path, when clearing found nothing: the audit finds the chunks through the handler
        located = audit.begin(target, None, lambda: handler._models(Owner(), (), {}))
        assert located is not None and located.models is None
        pending = audit.begin(target, Exploding())
        assert pending is not None
        latest = pending.finish(stats.count_audit)
        # An iterable the offload iterates is never iterated by the audit: reported, not raised.
        assert latest is not None and latest["total_bytes"] == 0 and "not inspected" in latest["errors"][0]
        assert pending.models is None, "nothing kept after the report"
    finally:
        stats.reset()
    assert sum("residue audit (locate) failed" in r.getMessage() for r in caplog.records) == 1


def test_the_audit_of_a_call_the_shim_left_alone_finds_the_calls_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call the shim leaves alone (its target switched off at run time) is audited all the same: the
    audit finds the call's chunks through the handler's own reading of the call."""
    import inspect

    import torch

    from te_offload_shim.engine import stats
    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations.targets import Target

    def offload(models: object) -> str:
        return "offloaded"

    monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", "cpu")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_DISABLE", "left-alone")
    target = Target("left-alone", "m", "offload", "models")
    handler = Handler(target, inspect.signature(offload), "function", Record("target", None, "offload", offload))
    stats.reset()
    try:
        assert handler(offload, None, ([torch.nn.Linear(4, 4)],), {}) == "offloaded"
        latest = stats.counts()["audit"]
        assert latest is not None and latest["by_category"]["parameters"] == (16 + 4) * F32, latest
    finally:
        stats.reset()


def test_the_audit_of_a_method_left_alone_binds_its_instance_and_of_a_call_that_does_not_bind_finds_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's reading of a call left alone, for the audit: a method's call is bound with its
    instance (the chunks are found), and a call that does not bind finds no chunks, quietly (the
    original raises its own error)."""
    import inspect

    import torch

    from te_offload_shim.engine import stats
    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations.targets import Target

    class Engine:
        def offload(self, models: object) -> str:
            return "offloaded"

    monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", "cpu")
    monkeypatch.setenv("TE_OFFLOAD_SHIM_DISABLE", "left-alone")
    target = Target("left-alone", "m", "Engine.offload", "models")
    record = Record("target", Engine, "offload", Engine.offload)
    handler = Handler(target, inspect.signature(Engine.offload), "method", record)
    engine = Engine()
    stats.reset()
    try:
        assert handler(engine.offload, engine, ([torch.nn.Linear(4, 4)],), {}) == "offloaded"
        latest = stats.counts()["audit"]
        assert latest is not None and latest["by_category"]["parameters"] == (16 + 4) * F32, latest
        with caplog.at_level(logging.WARNING, logger="te_offload_shim"), pytest.raises(TypeError):
            handler(engine.offload, engine, (), {"weights": True})  # the original's own TypeError
        assert "residue audit" not in caplog.text, "a call that does not bind has no chunks: nothing failed"
    finally:
        stats.reset()


def test_audit_hands_the_applications_signal_handler_exception_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit never raises its own failure into the offload, but a timeout the application's
    signal handler raises while the audit runs is the application's (guarantee 34): it goes on, the
    very object; the audit's own failure after it is still said, not raised."""
    import signal

    import torch

    from te_offload_shim.engine import stats
    from te_offload_shim.integrations.targets import Target
    from te_offload_shim.reports import audit, residue

    class StepTimeout(Exception):
        pass

    def timeout(signum: int, frame: object) -> None:
        raise StepTimeout("step 7 took too long")

    def alarmed(models: object, **_: object) -> object:
        signal.raise_signal(signal.SIGALRM)  # the handler runs here, inside the audit
        raise AssertionError("unreachable")

    monkeypatch.setattr(residue, "residue", alarmed)
    target = Target("t", "m", "C.offload", "self.model")
    old = signal.signal(signal.SIGALRM, timeout)
    try:
        pending = audit.begin(target, [torch.nn.Linear(2, 2)])
        assert pending is not None
        with pytest.raises(StepTimeout, match="step 7"):
            pending.finish(stats.count_audit)
        assert pending.models is None, "nothing kept after the audit"
    finally:
        signal.signal(signal.SIGALRM, old)
        stats.reset()
    monkeypatch.setattr(residue, "residue", lambda models, **_: 1 / 0)
    pending = audit.begin(target, [])
    assert pending is not None
    assert pending.finish(stats.count_audit) is None  # its own failure: said once, never raised


@pytest.mark.subprocess(fresh=True)
def test_import_loads_neither_the_report_nor_torch() -> None:
    import sys

    import te_offload_shim

    lazy = {f"te_offload_shim.reports.{m}" for m in ("residue", "audit", "process_memory")}
    assert not {"torch", *lazy} & set(sys.modules)
    assert te_offload_shim.stats()["audit"] is None
    import te_offload_shim.reports.audit
    import te_offload_shim.reports.residue

    assert "torch" not in sys.modules, "the report takes torch from sys.modules, never imports it"
    assert callable(te_offload_shim.residue), "the public function, not shadowed by a submodule"
    assert te_offload_shim.residue(None).total_bytes == 0


def _ddp_bytes(model: object) -> int:
    return sum(t.untyped_storage().nbytes() for b in model.buffers for t in (b.param_data, b.grad_data))  # type: ignore[attr-defined]


@pytest.mark.subprocess(verl="0.8.0", timeout=300)
def test_real_verl_offload_residue_before_after_and_one_audit_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl 0.8.0's own offload on a real GPTModel in megatron DDP with TE-layout caches: once as
    verl ships it (the shim's `__wrapped__`), once through the shim; then the audit line."""
    import gc
    import json
    import weakref

    import torch
    from verl.utils import megatron_utils as mu  # verl first: the shim patches it when imported below

    import te_offload_shim as shim
    from harness import megatron_world as w
    from te_offload_shim import health

    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    plain, shimmed = w.wrap_ddp(w.build_gpt()), w.wrap_ddp(w.build_gpt())
    w.attach_fp8_caches(plain)
    w.attach_fp8_caches(shimmed)
    caches = w.cache_state([plain])["bytes"]
    ddp = _ddp_bytes(plain)

    before = shim.residue([plain], device_type="cpu")
    assert before.by_category["ddp_buffers"] == ddp > 0
    assert before.by_category["parameters"] == 0, "every weight is a view into the DDP buffer"
    assert before.by_category["fp8_workspaces"] == caches > 0

    mu.offload_megatron_model_to_cpu.__wrapped__([plain])  # verl without the shim
    without = shim.residue([plain], device_type="cpu")
    assert without.by_category["ddp_buffers"] == 0
    assert without.by_category["fp8_workspaces"] == caches, "what verl's offload leaves on the GPU"

    mu.offload_megatron_model_to_cpu([shimmed])  # through the shim; the audit switch is off
    with_shim = shim.residue([shimmed], device_type="cpu")
    assert with_shim.by_category["ddp_buffers"] == with_shim.by_category["fp8_workspaces"] == 0
    assert with_shim.total_bytes == without.total_bytes - caches, "the caches are the only difference"
    assert shim.stats()["audit"] is None

    # State the offload neither moves nor clears (MoE dispatcher state survived it in NeMo-RL #2319).
    shimmed.module.decoder.dispatcher_state = torch.ones(256)
    for switch in ("1", "1", "cpu"):  # `cpu`: the audit counts host tensors, so there is something to see here
        monkeypatch.setenv("TE_OFFLOAD_SHIM_AUDIT", switch)
        mu.load_megatron_model_to_gpu([shimmed])
        w.attach_fp8_caches(shimmed)
        mu.offload_megatron_model_to_cpu([shimmed])
    lines = [r for r in caplog.records if "audit after" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO, logging.DEBUG, logging.DEBUG], "one INFO line per process"
    assert "verl.utils.megatron_utils:offload_megatron_model_to_cpu" in lines[0].getMessage()
    latest = shim.stats()["audit"]
    assert latest is not None and latest["audits"] == 3 and latest["device_type"] == "cpu"
    assert latest["by_category"] == {**with_shim.by_category, "other": 256 * F32}
    assert latest["other"] == {"dispatcher_state": 256 * F32}
    assert latest["top"][0]["path"] == "chunk0.module.decoder"
    assert "other 1.00 KiB (dispatcher_state 1.00 KiB)" in lines[2].getMessage()

    status = health.collect()  # what `te-offload-shim status --json` prints
    assert status["audit"]["enabled"] and status["audit"]["latest"]["audits"] == 3
    assert json.loads(json.dumps(status))["audit"]["latest"]["by_category"] == latest["by_category"]

    refs = [weakref.ref(shimmed), weakref.ref(shimmed.buffers[0].param_data)]
    del shimmed
    gc.collect()
    assert [r() for r in refs] == [None, None], "the audit keeps nothing alive"


# TE's symmetric memory, by release: `symmetric_mem_cache` is in distributed.py of every wheel from 2.4
# (not 2.1), `_SYMM_MEM_POOL` from 2.18, `release_symm_mem_pool()` from 2.19.
SYMMETRIC = {"2.1.0": (False, False), "2.4.0": (True, False), "2.16.1": (True, False), "2.18.0": (True, True)}
SYMMETRIC["2.20.2"] = (True, True)


def _te_release(release: str) -> Any:
    from harness import te_releases

    if not te_releases.installed(release):
        return missing(f"TE {release} not in {te_releases.folder(release)}")
    return pytest.mark.subprocess()


@pytest.mark.parametrize("release", [pytest.param(r, marks=_te_release(r)) for r in SYMMETRIC])
def test_te_symmetric_memory_is_named_where_the_release_has_it(release: str) -> None:
    """TE's own `transformer_engine.pytorch.distributed` from the release's wheel (harness/te_import.py):
    its symmetric-memory cache and pool are named with their bytes, where the release has them."""
    import sys

    import torch

    import te_offload_shim as shim
    from harness import te_import

    te_import.load(release)
    import transformer_engine.pytorch.distributed  # noqa: F401  (TE's own module, as TE's layers import it)

    te_dist = sys.modules["transformer_engine.pytorch.distributed"]
    has_cache, has_pool = SYMMETRIC[release]
    assert ["symmetric_mem_cache" in vars(te_dist), "_SYMM_MEM_POOL" in vars(te_dist)] == [has_cache, has_pool]
    assert te_dist.__dict__.get("_SYMM_MEM_POOL") is None, "TE creates the pool on first use only"

    class Pool:  # torch.cuda.MemPool needs a GPU: what the report reads of one, its snapshot()'s segments
        def snapshot(self) -> list[dict[str, int]]:
            return [{"total_size": 2 << 20}, {"total_size": 1 << 20}]

    if has_cache:
        te_dist.symmetric_mem_cache[(64, torch.float32, "cpu", None, None)] = torch.empty(64, dtype=torch.float32)
    if has_pool:
        te_dist._SYMM_MEM_POOL = Pool()  # type: ignore[attr-defined]  # TE's module: no types
    found = shim.residue([torch.nn.Linear(2, 2)], device_type="cpu").te_global
    assert [found.get("symmetric_mem_cache"), found.get("symm_mem_pool")] == [
        64 * F32 if has_cache else None,
        (3 << 20) if has_pool else None,
    ]
    if has_pool:
        te_dist._SYMM_MEM_POOL = object()  # type: ignore[attr-defined]  # a pool whose segments cannot be read: present, size unknown
        report = shim.residue([torch.nn.Linear(2, 2)], device_type="cpu")
        assert "symm_mem_pool" in report.te_global and report.te_global["symm_mem_pool"] is None
        assert "symm_mem_pool present" in report.summary()


def test_private_pools_are_read_from_the_allocators_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments outside the default pool (CUDA graphs' private pools, MemPools) per device, from
    `torch.cuda.memory_snapshot()`'s segment records (`device`, `segment_pool_id`, `total_size`), here
    as torch writes them; read only where CUDA is initialised (no GPU here: the driver-visible figure
    is a device run's)."""
    import torch

    import te_offload_shim as shim

    assert shim.residue([torch.nn.Linear(2, 2)], device_type="cpu").private_pools == {}, "CUDA not started: none"
    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 20 << 20},  # the default pool: not counted
        {"device": 0, "segment_pool_id": (1, 3), "total_size": 2 << 20},  # a graph's private pool
        {"device": 0, "segment_pool_id": (0, 7), "total_size": 4 << 20},  # a MemPool
        {"device": 1, "segment_pool_id": (1, 5), "total_size": 8 << 20},
    ]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda include_traces=True: segments)
    report = shim.residue([torch.nn.Linear(2, 2)], device_type="cpu")
    assert report.private_pools == {"cuda:0": 6 << 20, "cuda:1": 8 << 20}
    assert "private pools (CUDA graphs, MemPools): cuda:0 6.00 MiB, cuda:1 8.00 MiB" in report.summary()
    assert report.as_dict()["private_pools"] == report.private_pools


def test_the_report_names_the_ddp_buffer_lists_megatrons_owner_search_reads() -> None:
    """The residue report sits below integrations/ and keeps its own copy of Megatron's DDP buffer
    lists: the two stay equal."""
    from te_offload_shim.integrations.megatron import DDP_BUFFER_LISTS
    from te_offload_shim.reports import residue

    assert residue.DDP_BUFFER_LISTS == DDP_BUFFER_LISTS


def test_the_applications_signal_handler_exception_inside_the_report_reaches_the_caller() -> None:
    """A timeout the application's SIGALRM handler raises while `residue()` reads a tensor (here the
    storage of a parameter's tensor subclass) is the application's, as in every fail-open path
    (guarantee 34): raised on, never written into the report's `errors`. An exception of the
    tensor's own is still one error of the report. (A parameter of a tensor subclass that is not
    TE's is counted: its methods named like TE's fields, `Tensor.amax`, were taken for its parts.)"""
    import signal

    import torch

    from te_offload_shim.reports.residue import residue

    class StepTimeout(Exception):
        pass

    def timeout(signum: int, frame: object) -> None:
        raise StepTimeout("step 7 took too long")

    class Alarmed(torch.Tensor):
        def untyped_storage(self) -> torch.UntypedStorage:
            signal.raise_signal(signal.SIGALRM)  # the handler runs here, inside the report's claim
            raise AssertionError("unreachable")

    class Broken(torch.Tensor):
        def untyped_storage(self) -> torch.UntypedStorage:
            raise RuntimeError("no storage")

    class Plain(torch.Tensor):  # a tensor subclass not TE's: its `amax` is Tensor's method, no field
        pass

    layer = torch.nn.Linear(2, 2)
    layer.weight = torch.nn.Parameter(torch.ones(2, 2).as_subclass(Plain))
    assert residue(layer, device_type="cpu").by_category["parameters"] == (4 + 2) * F32, "the weight is counted"
    layer.weight = torch.nn.Parameter(torch.ones(2, 2).as_subclass(Alarmed))
    old = signal.signal(signal.SIGALRM, timeout)
    try:
        with pytest.raises(StepTimeout, match="step 7"):
            residue(layer, device_type="cpu")
    finally:
        signal.signal(signal.SIGALRM, old)
    layer.weight = torch.nn.Parameter(torch.ones(2, 2).as_subclass(Broken))
    report = residue(layer, device_type="cpu")
    assert [e for e in report.errors if "RuntimeError: no storage" in e], report.errors
