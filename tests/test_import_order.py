"""Import-order matrix (the orderings ddtrace tests its integrations with), uninstall, reload.

Each case runs in a fresh interpreter against real verl 0.8.0 and its real caller module, which
from-imports `offload_megatron_model_to_cpu`. `import` imports the caller; `patch` is the first
`import te_offload_shim` (which installs) or a later `install()`; `unpatch` is `uninstall()`.
Each case asserts the number of our wrapper layers on the module attribute and on the caller's
alias, that uninstall puts back the very original object, and that the caches are cleared exactly
when the shim is installed.
"""

from __future__ import annotations

import pytest
from conftest import run_py

# Runs STEPS in order. `IMPORT` names the module the application imports; `ORIGINAL()` reads the
# target as it is before any patch, so that uninstall can be checked to restore that very object.
STEP_DRIVER = """
import importlib, sys
original = None
for step in STEPS:
    if step == "import":
        importlib.import_module(IMPORT)
        if original is None and "te_offload_shim" not in sys.modules:
            original = ORIGINAL()
    elif step == "patch":
        if "te_offload_shim" in sys.modules:
            sys.modules["te_offload_shim"].install()
        else:
            import te_offload_shim
    elif step == "unpatch":
        sys.modules["te_offload_shim"].uninstall()
"""


def _driver(steps: list[str], module: str, original: str) -> str:
    return f"IMPORT = {module!r}\nORIGINAL = lambda: {original}\nSTEPS = {steps!r}\n" + STEP_DRIVER


CASE = """
import torch
from harness import te_standins as te
from harness.megatron_world import apply_cpu_quirks
apply_cpu_quirks()
DRIVER
import te_offload_shim
from te_offload_shim.engine.patch import shim_layers
mu = sys.modules["verl.utils.megatron_utils"]
caller = sys.modules["verl.workers.engine.megatron.transformer_impl"]
layer = te.TELinearStandIn(16, 16)
te.fill_like_forward(layer)
mu.offload_megatron_model_to_cpu([torch.nn.Sequential(layer)])  # verl's plain-module (reference model) path
fn = mu.offload_megatron_model_to_cpu
emit(module_layers=shim_layers(fn), caller_layers=shim_layers(caller.offload_megatron_model_to_cpu),
     same_object=caller.offload_megatron_model_to_cpu is fn,
     is_original=(original is not None and fn is original),
     cleared=not layer._fp8_workspaces, installed=te_offload_shim.installed())
"""

MATRIX = {
    # steps: shim installed at the end?
    "import-patch": True,
    "patch-import": True,
    "patch-patch-import": True,
    "import-patch-patch": True,
    "patch-import-patch": True,
    "patch-unpatch-import": False,
    "patch-unpatch-patch-import": True,
    "import-patch-unpatch": False,
    "import-patch-unpatch-patch": True,
    "patch-import-unpatch": False,
    "patch-import-unpatch-patch": True,
    "import-patch-unpatch-unpatch": False,
    "patch-import-unpatch-patch-unpatch": False,
}


@pytest.mark.parametrize("order", list(MATRIX))
def test_import_order(order: str) -> None:
    steps = order.split("-")
    driver = _driver(
        steps,
        "verl.workers.engine.megatron.transformer_impl",
        'sys.modules["verl.utils.megatron_utils"].offload_megatron_model_to_cpu',
    )
    r = run_py(CASE.replace("DRIVER", driver), verl="0.8.0")
    active = MATRIX[order]
    assert r["installed"] is active
    assert r["module_layers"] == int(active) and r["caller_layers"] == int(active)
    assert r["same_object"], "the caller's alias and the module attribute must agree"
    assert r["cleared"] is active
    if not active and steps[0] == "import":
        assert r["is_original"], "uninstall must restore the very original function object"


RELOAD = """
import importlib, sys, torch
from harness import te_standins as te
from harness.megatron_world import apply_cpu_quirks
apply_cpu_quirks()
import te_offload_shim
from te_offload_shim.engine.patch import shim_layers
import verl.utils.megatron_utils as mu
before = mu.offload_megatron_model_to_cpu
mu = importlib.reload(mu)
after = mu.offload_megatron_model_to_cpu
layer = te.TELinearStandIn(16, 16)
te.fill_like_forward(layer)
after([torch.nn.Sequential(layer)])
reloaded_cleared = not layer._fp8_workspaces
layers = {"before": shim_layers(before), "after": shim_layers(after), "fresh": after is not before}
te_offload_shim.uninstall()  # (this also points __main__'s own `after` back at the original)
mu = importlib.reload(mu)
emit(**layers, cleared=reloaded_cleared, after_uninstall=shim_layers(mu.offload_megatron_model_to_cpu))
"""


def test_reload_of_a_target_module_is_patched_again() -> None:
    """wrapt's own post-import hooks fire once; ours stay on the meta path and see the reload."""
    r = run_py(RELOAD, verl="0.8.0")
    assert r["before"] == 1 and r["after"] == 1 and r["fresh"] and r["cleared"]
    assert r["after_uninstall"] == 0, "uninstall unregisters the watcher: a later reload stays plain"


PICKLING = """
import inspect, pickle, sys
import cloudpickle
import te_offload_shim
from te_offload_shim.engine.patch import ShimWrapper
import verl.utils.megatron_utils as mu
fn = mu.offload_megatron_model_to_cpu
orig = fn.__wrapped__
out = {}
for name, lib in (("pickle", pickle), ("cloudpickle", cloudpickle)):
    data = lib.dumps(fn)
    out[name] = {"same": lib.loads(data) is fn, "by_reference": len(data) < 300}
emit(wrapper=type(fn) is ShimWrapper, pickles=out,
     signature=str(inspect.signature(fn)) == str(inspect.signature(orig)),
     name=fn.__name__ == orig.__name__ == "offload_megatron_model_to_cpu",
     doc=fn.__doc__ == orig.__doc__ and bool(fn.__doc__),
     module=fn.__module__ == "verl.utils.megatron_utils", qualname=fn.__qualname__ == orig.__qualname__)
"""


def test_pickling_and_introspection() -> None:
    """Ray pickles by value what it cannot import; our wrapper must pickle by reference."""
    r = run_py(PICKLING, verl="0.8.0")
    assert r["wrapper"]
    assert r["pickles"] == {
        "pickle": {"same": True, "by_reference": True},
        "cloudpickle": {"same": True, "by_reference": True},
    }
    assert r["signature"] and r["name"] and r["doc"] and r["module"] and r["qualname"]


def test_wrapt_in_use_is_the_one_ci_asked_for() -> None:
    """CI runs the subprocess suites twice: wrapt 2.x (the venv) and wrapt 1.x (.deps/wrapt-1)."""
    import os

    r = run_py("import wrapt\nemit(version=wrapt.__version__)")
    expected = os.environ.get("TEST_EXPECT_WRAPT_MAJOR")
    if expected:
        assert r["version"].split(".")[0] == expected
    else:
        assert int(r["version"].split(".")[0]) >= 1


METHOD_CASE = """
from harness import megatron_world as w
DRIVER
import te_offload_shim
from te_offload_shim.engine.patch import shim_layers
from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
model = w.wrap_ddp(w.build_gpt(layers=1, hidden=32, vocab=64))
w.attach_fp8_caches(model)
for buffer in model.buffers:
    buffer.offload_to_cpu()
current = vars(_ParamAndGradBuffer)["offload_to_cpu"]
emit(layers=shim_layers(current), is_original=original is not None and current is original,
     left=w.cache_state([model])["entries"], installed=te_offload_shim.installed())
"""

METHOD_ORDERS = (
    "import-patch",
    "patch-import",
    "patch-patch-import",
    "patch-unpatch-import",
    "import-patch-unpatch",
    "import-patch-unpatch-patch",
)


@pytest.mark.parametrize("order", METHOD_ORDERS)
def test_import_order_of_a_method_target(order: str) -> None:
    """The same orderings for a `Class.method` target: megatron-core's own buffer offload."""
    steps = order.split("-")
    pgb = "megatron.core.distributed.param_and_grad_buffer"
    driver = _driver(steps, pgb, f'vars(sys.modules["{pgb}"]._ParamAndGradBuffer)["offload_to_cpu"]')
    r = run_py(METHOD_CASE.replace("DRIVER", driver))
    active = MATRIX[order]
    assert r["installed"] is active and r["layers"] == int(active)
    assert (r["left"] == 0) is active, "cleared exactly when installed"
    if not active and steps[0] == "import":
        assert r["is_original"], "uninstall must put the very original method back on the class"
