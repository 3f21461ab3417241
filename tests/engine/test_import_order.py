"""Import-order matrix (the orderings ddtrace tests its integrations with), uninstall, reload.

The detailed matrix runs each case in a fresh interpreter against real verl 0.8.0 and its real
caller module, which from-imports `offload_megatron_model_to_cpu`, and against megatron-core's own
buffer offload (a `Class.method` target). `import` imports the caller; `patch` is the first
`import te_offload_shim` (which installs) or a later `install()`; `unpatch` is `uninstall()`. Each case
asserts the number of our wrapper layers on the module attribute and on the caller's alias, that
uninstall puts back the very original object, and that the caches are cleared exactly when the shim
is installed.

The BUILTIN matrix then takes every entry of the table through both orders, a few entries per fresh
interpreter (see `_both_orders`). This module imports nothing heavy, nor the shim, at its top: the
fresh interpreters import it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import DEPS, use_mirrors
from support.entries import CASES, Call
from support.set_up import needs


def _drive(steps: list[str], module: str, original: Callable[[], object]) -> object:
    """Run `steps` in order: `import` imports `module`, `patch` installs, `unpatch` uninstalls.
    Returns the target as it was before any patch (`original()` right after its first import, when
    the shim was not imported yet), so that uninstall can be checked to restore that very object."""
    found = None
    for step in steps:
        if step == "import":
            importlib.import_module(module)
            if found is None and "te_offload_shim" not in sys.modules:
                found = original()
        elif step == "patch":
            if "te_offload_shim" in sys.modules:
                sys.modules["te_offload_shim"].install()
            else:
                import te_offload_shim  # noqa: F401  (the first import installs)
        elif step == "unpatch":
            sys.modules["te_offload_shim"].uninstall()
    return found


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


@pytest.mark.subprocess(verl="0.8.0")
@pytest.mark.parametrize("order", list(MATRIX))
def test_import_order(order: str) -> None:
    import torch

    from harness import te_standins as te
    from harness.megatron_world import apply_cpu_quirks

    apply_cpu_quirks()
    steps = order.split("-")
    original = _drive(
        steps,
        "verl.workers.engine.megatron.transformer_impl",
        lambda: sys.modules["verl.utils.megatron_utils"].offload_megatron_model_to_cpu,
    )
    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    mu = sys.modules["verl.utils.megatron_utils"]
    caller = sys.modules["verl.workers.engine.megatron.transformer_impl"]
    layer = te.TELinearStandIn(16, 16)
    te.fill_like_forward(layer)
    mu.offload_megatron_model_to_cpu([torch.nn.Sequential(layer)])  # verl's plain-module (reference model) path
    fn = mu.offload_megatron_model_to_cpu
    active = MATRIX[order]
    assert te_offload_shim.installed() is active
    assert shim_layers(fn) == int(active) and shim_layers(caller.offload_megatron_model_to_cpu) == int(active)
    assert caller.offload_megatron_model_to_cpu is fn, "the caller's alias and the module attribute must agree"
    assert (not layer._fp8_workspaces) is active
    if not active and steps[0] == "import":
        assert original is not None and fn is original, "uninstall must restore the very original function object"


@pytest.mark.subprocess(verl="0.8.0")
def test_reload_of_a_target_module_is_patched_again() -> None:
    """wrapt's own post-import hooks fire once; ours stay on the meta path and see the reload."""
    import torch

    from harness import te_standins as te
    from harness.megatron_world import apply_cpu_quirks

    apply_cpu_quirks()
    import te_offload_shim  # first, then verl
    from te_offload_shim.engine.patch import shim_layers

    mu = importlib.import_module("verl.utils.megatron_utils")
    before = mu.offload_megatron_model_to_cpu
    mu = importlib.reload(mu)
    after = mu.offload_megatron_model_to_cpu
    layer = te.TELinearStandIn(16, 16)
    te.fill_like_forward(layer)
    after([torch.nn.Sequential(layer)])
    assert shim_layers(before) == 1 and shim_layers(after) == 1 and after is not before
    assert not layer._fp8_workspaces
    te_offload_shim.uninstall()
    mu = importlib.reload(mu)
    assert shim_layers(mu.offload_megatron_model_to_cpu) == 0, (
        "uninstall unregisters the watcher: a later reload stays plain"
    )


@pytest.mark.subprocess(verl="0.8.0")
def test_pickling_and_introspection() -> None:
    """Ray pickles by value what it cannot import; our wrapper must pickle by reference."""
    import inspect
    import pickle

    import cloudpickle

    import te_offload_shim  # noqa: F401  (installs, then verl is imported)
    from te_offload_shim.engine.patch import ShimWrapper

    mu = importlib.import_module("verl.utils.megatron_utils")

    fn = mu.offload_megatron_model_to_cpu
    orig = fn.__wrapped__
    assert type(fn) is ShimWrapper
    for name, lib in (("pickle", pickle), ("cloudpickle", cloudpickle)):
        data = lib.dumps(fn)
        assert lib.loads(data) is fn, name
        assert len(data) < 300, f"{name} must pickle the wrapper by reference"
    assert str(inspect.signature(fn)) == str(inspect.signature(orig))
    assert fn.__name__ == orig.__name__ == "offload_megatron_model_to_cpu"
    assert fn.__doc__ == orig.__doc__ and bool(fn.__doc__)
    assert fn.__module__ == "verl.utils.megatron_utils" and fn.__qualname__ == orig.__qualname__


@pytest.mark.subprocess()
def test_wrapt_in_use_is_the_one_ci_asked_for() -> None:
    """CI runs the subprocess suites twice: wrapt 2.x (the venv) and wrapt 1.x (.deps/wrapt-1)."""
    import os

    import wrapt

    expected = os.environ.get("TEST_EXPECT_WRAPT_MAJOR")
    major = wrapt.__version__.split(".")[0]  # type: ignore[attr-defined]  # wrapt's own types omit __version__
    if expected:
        assert major == expected
    else:
        assert int(major) >= 1
    wanted = os.environ.get("TEST_EXPECT_WRAPT")  # CI's pass on the declared floor: exactly that release
    if wanted:
        assert wrapt.__version__.startswith(wanted + "."), wrapt.__version__  # type: ignore[attr-defined]


@pytest.mark.subprocess()
def test_torch_in_use_is_the_one_ci_asked_for() -> None:
    """CI runs the wrapper tests, the net's and a twin subset again under torch 2.15.0 (.deps/torch-2.15.0)."""
    import os

    import torch

    wanted = os.environ.get("TEST_EXPECT_TORCH")
    assert torch.__version__.startswith(wanted) if wanted else torch.__version__ >= "2"


METHOD_ORDERS = (
    "import-patch",
    "patch-import",
    "patch-patch-import",
    "patch-unpatch-import",
    "import-patch-unpatch",
    "import-patch-unpatch-patch",
)


@pytest.mark.subprocess()
@pytest.mark.parametrize("order", METHOD_ORDERS)
def test_import_order_of_a_method_target(order: str) -> None:
    """The same orderings for a `Class.method` target: megatron-core's own buffer offload."""
    from harness import megatron_world as w

    steps = order.split("-")
    pgb = "megatron.core.distributed.param_and_grad_buffer"
    original = _drive(steps, pgb, lambda: vars(sys.modules[pgb]._ParamAndGradBuffer)["offload_to_cpu"])
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer

    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    model = w.wrap_ddp(w.build_gpt(layers=1, hidden=32, vocab=64))
    w.attach_fp8_caches(model)
    for buffer in model.buffers:
        buffer.offload_to_cpu()
    current = vars(_ParamAndGradBuffer)["offload_to_cpu"]
    active = MATRIX[order]
    assert te_offload_shim.installed() is active and shim_layers(current) == int(active)
    assert (w.cache_state([model])["entries"] == 0) is active, "cleared exactly when installed"
    if not active and steps[0] == "import":
        assert original is not None and current is original, (
            "uninstall must put the very original method back on the class"
        )


# --- every BUILTIN entry, both orders --------------------------------------------------------------
#
# A row calls its entry point the way the framework does (each entry's case, tests/support/entries.py),
# on megatron DDP chunks whose TE layers hold cached FP8 copies (real modules for verl, megatron-core
# and ms-swift; the mirrors of tests/mirrors/ for the rest). `module` is the target module as imported.

ROWS: dict[str, Call] = {name: case.call for name, case in CASES.items()}

# Entries whose modules cannot be imported next to the others: the nemo_rl 0.5 mirror has the 0.6
# layout's module name, and ms-swift needs Transformer Engine's import-only stand-in; the real siiRL
# releases (two packages named `siirl`) are each on the path in a test of their own.
APART = ("nemo-rl-0.5", "ms-swift")
SIIRL = {"0.2.0": ("siirl", "siirl-reward"), "0.1.0.post1": ("siirl-reward-0.1",)}


def test_every_builtin_entry_has_a_row() -> None:
    from te_offload_shim.integrations.targets import BUILTIN

    names = [t.name for t in BUILTIN]
    missing, extra = sorted(set(names) - set(ROWS)), sorted(set(ROWS) - set(names))
    assert not missing and not extra, (
        f"entries without a case in tests/support/entries.py: {missing}; cases for no entry: {extra}"
    )


def _both_orders(names: list[str], prepare: Callable[[], None]) -> None:
    """Order "before" on a pristine interpreter: the shim's first import, then every target module.
    Order "after": `uninstall()`, then `install()` again over the modules already imported (the same
    path as a first import of the shim after them: `watch` of an imported module patches it at once).
    The modules are imported once, so every row calls into the very classes its chunks were built
    against; a re-import or reload would make new ones (megatron DDP holds the buffer class it
    imported). For each entry: one layer of ours on the attribute, a call that clears the caches,
    counted for that entry; uninstall puts back the very original object."""
    import te_offload_shim
    from harness import megatron_world as w
    from te_offload_shim.engine import stats
    from te_offload_shim.engine.patch import owner_of, shim_layers
    from te_offload_shim.integrations.targets import BUILTIN

    targets = [t for t in BUILTIN if t.name in names]
    assert not [t.module for t in targets if t.module in sys.modules], "the shim must come first"
    prepare()
    for target in targets:
        importlib.import_module(target.module)

    def attribute(name: str) -> Any:
        target = next(t for t in targets if t.name == name)
        found = owner_of(sys.modules[target.module], target.attribute)
        assert found is not None, name
        return vars(found[0])[found[1]]

    def check_patched_and_clearing() -> None:
        for target in targets:
            assert shim_layers(attribute(target.name)) == 1, target.name
            chunks = [w.wrap_ddp(w.build_gpt(layers=1, hidden=32, vocab=64))]
            entries = w.attach_fp8_caches(chunks[0])
            assert entries > 0
            stats.reset()
            ROWS[target.name](sys.modules[target.module], chunks)
            by_target = {k: [v["calls"], v["entries"]] for k, v in te_offload_shim.stats()["by_target"].items()}
            assert by_target == {target.name: [1, entries]}, target.name
            assert w.cache_state(chunks)["entries"] == 0, target.name

    check_patched_and_clearing()  # order "before"
    originals = {t.name: attribute(t.name).__wrapped__ for t in targets}
    te_offload_shim.uninstall()
    for name, original in originals.items():
        assert attribute(name) is original and shim_layers(original) == 0, name
    assert te_offload_shim.install()
    check_patched_and_clearing()  # order "after"
    te_offload_shim.uninstall()
    for name, original in originals.items():
        assert attribute(name) is original, f"{name}: uninstall must restore the very original object"


@pytest.mark.subprocess(verl="0.8.0", timeout=240)
def test_builtin_entries_in_both_orders() -> None:
    siirl = {name for names in SIIRL.values() for name in names}
    _both_orders([name for name in ROWS if name not in APART and name not in siirl], use_mirrors)


@pytest.mark.subprocess(timeout=240)
def test_builtin_entries_apart_in_both_orders() -> None:
    """nemo-rl 0.5's mirror, and the real ms-swift 4.6.0 set up as in tests/integrations/test_ms_swift.py."""
    swift = DEPS / "ms-swift-4.6.0"
    needs(swift / "swift", f"ms-swift 4.6.0 not installed in {swift}")

    def prepare() -> None:
        CASES["nemo-rl-0.5"].prepare()
        CASES["ms-swift"].prepare()

    _both_orders(list(APART), prepare)


@pytest.mark.subprocess(timeout=240)
@pytest.mark.parametrize("release", list(SIIRL))
def test_builtin_siirl_entries_in_both_orders(release: str) -> None:
    """The real siiRL releases, set up as their cases say (the `siirl` entry's module is the same in
    0.1, and is checked with 0.2.0)."""
    names = SIIRL[release]
    _both_orders(list(names), CASES[names[0]].prepare)
