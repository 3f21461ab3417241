"""The shim on real verl releases and a real megatron-core model, each case in a fresh interpreter.

The FP8 caches are TE >= 1.8 layout stand-ins (harness/te_standins.py); everything else is real:
verl's own `offload_megatron_model_to_cpu`, called through the module that from-imports it, on a
megatron `GPTModel` wrapped in megatron DDP.
"""

from __future__ import annotations

import pytest
from conftest import FIXED_VERL, UNFIXED_VERL, run_py, verl_path

ENGINE = "verl.workers.engine.megatron.transformer_impl"  # the caller in 0.6.0+ (only one from 0.8.0)
WORKERS = "verl.workers.megatron_workers"  # the caller in 0.4.0 - 0.7.1

BUILD = """
import importlib, torch
from harness import megatron_world as w
model = w.wrap_ddp(w.build_gpt())
w.attach_fp8_caches(model)
initial = w.cache_state([model])
before = w.weights(model)
flushes = []
# verl's own flush on CPU: record what is still cached at the moment the allocator is flushed
torch.cpu.empty_cache = lambda: flushes.append(w.cache_state([model])["entries"])
"""

OFFLOAD = """
caller = importlib.import_module(CALLER)
caller.offload_megatron_model_to_cpu([model])
offload_flushes = list(flushes)  # the offload's own flushes, not the reload's
after = w.cache_state([model])
offloaded = all(b.param_data.untyped_storage().size() == 0 for b in model.buffers)
from verl.utils import megatron_utils as mu
mu.load_megatron_model_to_gpu([model])
import te_offload_shim as shim
from te_offload_shim.engine.patch import shim_layers
emit(initial=initial, after=after, flushes=offload_flushes, offloaded=offloaded,
     same=w.same_weights(before, w.weights(model)), stats=shim.stats(),
     caller_layers=shim_layers(caller.offload_megatron_model_to_cpu),
     module_layers=shim_layers(mu.offload_megatron_model_to_cpu),
     state={t["name"]: t["state"] for t in shim.status()["targets"]})
"""


def _declared_fixed(verl: str) -> bool | None:
    """What the table's `fixed_in` says of this release, read as `status` reads it (no import)."""
    from te_offload_shim.integrations import versions
    from te_offload_shim.integrations.targets import BUILTIN

    (info,) = verl_path(verl).glob("verl-*.dist-info")
    target = next(t for t in BUILTIN if t.name == "verl")
    return versions.fixed_upstream(target, info.name[len("verl-") : -len(".dist-info")])[0]


def _check_cleared(r: dict) -> None:
    assert r["initial"]["entries"] == 9 and r["initial"]["bytes"] > 0
    assert r["after"] == {"entries": 0, "bytes": 0}
    assert r["flushes"] == [0], "caches must be gone before verl's own allocator flush"
    assert r["offloaded"] and r["same"]
    assert r["stats"]["entries"] == 9 and r["stats"]["bytes"] == r["initial"]["bytes"]
    assert r["stats"]["calls"] == 1


@pytest.mark.parametrize("verl", UNFIXED_VERL)
def test_shim_imported_before_verl(verl: str) -> None:
    r = run_py(f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD + OFFLOAD, verl=verl)
    _check_cleared(r)
    assert r["caller_layers"] == 1 and r["module_layers"] == 1
    assert r["state"]["verl"] == "patched"
    assert _declared_fixed(verl) is False, "the declaration agrees with the real release's module"
    assert "cleared 9 FP8 weight workspaces" in r["_stderr"]


@pytest.mark.parametrize(("verl", "caller"), [("0.7.1", ENGINE), ("0.7.1", WORKERS), ("0.8.0", ENGINE)])
def test_verl_caller_and_model_before_shim(verl: str, caller: str) -> None:
    code = f"CALLER = {caller!r}\nimport importlib\nimportlib.import_module(CALLER)\n" + BUILD
    code += "assert 'te_offload_shim' not in sys.modules\nimport te_offload_shim\n" + OFFLOAD
    r = run_py(code, verl=verl)
    _check_cleared(r)
    assert r["caller_layers"] == 1, "the caller's from-imported alias must be rebound to the wrapper"


@pytest.mark.parametrize("verl", FIXED_VERL)
def test_fixed_verl_is_left_unwrapped_and_clears_itself(verl: str) -> None:
    r = run_py(f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD + OFFLOAD, verl=verl)
    assert r["state"]["verl"] == "fixed upstream"
    assert _declared_fixed(verl) is True, "the declaration agrees with the real release's module"
    assert r["caller_layers"] == 0 and r["module_layers"] == 0
    assert r["after"] == {"entries": 0, "bytes": 0}, "verl 0.9's own code clears the caches"
    assert r["stats"]["calls"] == 0
    assert r["offloaded"] and r["same"]


def test_disabled_by_environment_changes_nothing() -> None:
    code = f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD + OFFLOAD
    r = run_py(code, verl="0.8.0", env={"TE_OFFLOAD_SHIM": "0"})
    assert r["state"]["verl"] == "not installed"
    assert r["caller_layers"] == 0 and r["module_layers"] == 0
    assert r["after"] == r["initial"] and r["flushes"] == [9]
    assert r["offloaded"] and r["same"]
    assert r["stats"]["calls"] == 0


RAISING_WORKSPACE = """
class Exploding(dict):
    def pop(self, *a):
        raise RuntimeError("boom")
    def clear(self):
        raise RuntimeError("boom")
layer = w.linear_layers(model)[0][1]
layer.__dict__["_fp8_workspaces"] = Exploding(layer.__dict__["_fp8_workspaces"])
"""


def test_clearing_that_raises_does_not_stop_the_offload() -> None:
    code = f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD + RAISING_WORKSPACE + OFFLOAD
    r = run_py(code, verl="0.8.0")
    assert r["offloaded"] and r["same"]
    assert r["after"]["entries"] == 1, "the raising dict keeps its entry; the other 8 are cleared"
    assert r["stats"]["entries"] == 8 and r["stats"]["errors"] == 1
    assert r["_stderr"].count("cannot clear _fp8_workspaces") == 1


def test_clearing_that_raises_raises_in_strict_mode() -> None:
    code = f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD + RAISING_WORKSPACE
    code += """
caller = importlib.import_module(CALLER)
try:
    caller.offload_megatron_model_to_cpu([model])
except Exception as exc:
    emit(raised=type(exc).__name__, offloaded=all(b.param_data.untyped_storage().size() == 0 for b in model.buffers))
else:
    emit(raised=None)
"""
    r = run_py(code, verl="0.8.0", env={"TE_OFFLOAD_SHIM_STRICT": "1"})
    assert r["raised"] == "ShimError"
    assert r["offloaded"] is False
