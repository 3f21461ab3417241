"""The shim on real verl releases and a real megatron-core model, each case in a fresh interpreter.

The FP8 caches are TE >= 1.8 layout stand-ins (harness/te_standins.py); everything else is real:
verl's own `offload_megatron_model_to_cpu`, called through the module that from-imports it, on a
megatron `GPTModel` wrapped in megatron DDP. This module imports nothing heavy at its top.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import pytest
from conftest import FIXED_VERL, LEGACY_VERL, UNFIXED_VERL, verl_path
from support.verl_case import ENGINE, MODULE, WORKERS, build, offload


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


def on(versions: tuple[str, ...]) -> list[Any]:
    """One case per verl release, each in a fresh interpreter with that release on the path."""
    return [pytest.param(v, marks=pytest.mark.subprocess(verl=v)) for v in versions]


@pytest.mark.parametrize("verl", on(UNFIXED_VERL))
def test_shim_imported_before_verl(verl: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim  # noqa: F401  (first, as a user would)

    r = offload(build(), ENGINE)
    _check_cleared(r)
    assert r["caller_layers"] == 1 and r["module_layers"] == 1
    assert r["state"]["verl"] == "patched"
    assert _declared_fixed(verl) is False, "the declaration agrees with the real release's module"
    assert "cleared 9 FP8 weight workspaces" in caplog.text


@pytest.mark.parametrize("verl", on(LEGACY_VERL))
def test_shim_on_the_declared_floor_and_0_6(verl: str, caplog: pytest.LogCaptureFixture) -> None:
    """verl 0.4.0 (the table's `supported` floor, flushing with torch.cuda.empty_cache) and 0.6.1,
    their real offload called through its own module."""
    caplog.set_level(logging.INFO)
    import te_offload_shim  # noqa: F401

    r = offload(build(), MODULE)
    _check_cleared(r)
    assert r["module_layers"] == 1 and r["state"]["verl"] == "patched"
    assert _declared_fixed(verl) is False, "the declaration agrees with the real release's module"
    assert "cleared 9 FP8 weight workspaces" in caplog.text


@pytest.mark.parametrize(
    ("verl", "caller"),
    [
        pytest.param("0.7.1", ENGINE, marks=pytest.mark.subprocess(verl="0.7.1")),
        pytest.param("0.7.1", WORKERS, marks=pytest.mark.subprocess(verl="0.7.1")),
        pytest.param("0.8.0", ENGINE, marks=pytest.mark.subprocess(verl="0.8.0")),
    ],
)
def test_verl_caller_and_model_before_shim(verl: str, caller: str) -> None:
    importlib.import_module(caller)
    world = build()
    assert "te_offload_shim" not in sys.modules
    import te_offload_shim  # noqa: F401  (installs: patches the imported module, rebinds the alias)

    r = offload(world, caller)
    _check_cleared(r)
    assert r["caller_layers"] == 1, "the caller's from-imported alias must be rebound to the wrapper"


@pytest.mark.parametrize("verl", on(FIXED_VERL))
def test_fixed_verl_is_left_unwrapped_and_clears_itself(verl: str) -> None:
    import te_offload_shim  # noqa: F401

    r = offload(build(), ENGINE)
    assert r["state"]["verl"] == "fixed upstream"
    assert _declared_fixed(verl) is True, "the declaration agrees with the real release's module"
    assert r["caller_layers"] == 0 and r["module_layers"] == 0
    assert r["after"] == {"entries": 0, "bytes": 0}, "verl 0.9's own code clears the caches"
    assert r["stats"]["calls"] == 0
    assert r["offloaded"] and r["same"]


@pytest.mark.subprocess(verl=FIXED_VERL[0])
def test_status_says_fixed_verl_is_fixed_upstream_and_nothing_more() -> None:
    """The row the operator reads for a release that clears its own caches: the state, no reason added."""
    import te_offload_shim

    importlib.import_module(MODULE)
    rows = [(r["state"], r["detail"]) for r in te_offload_shim.status()["targets"] if r["name"] == "verl"]
    assert rows == [("fixed upstream", "")]


@pytest.mark.subprocess(verl="0.8.0", env={"TE_OFFLOAD_SHIM": "0"})
def test_disabled_by_environment_changes_nothing() -> None:
    import te_offload_shim  # noqa: F401

    r = offload(build(), ENGINE)
    assert r["state"]["verl"] == "not installed"
    assert r["caller_layers"] == 0 and r["module_layers"] == 0
    assert r["after"] == r["initial"] and r["flushes"] == [9]
    assert r["offloaded"] and r["same"]
    assert r["stats"]["calls"] == 0


class Exploding(dict):
    """A `_fp8_workspaces` dict whose clearing raises."""

    def pop(self, *args: Any) -> Any:
        raise RuntimeError("boom")

    def clear(self) -> None:
        raise RuntimeError("boom")


def explode_one(model: Any) -> None:
    from harness import megatron_world as w

    layer = w.linear_layers(model)[0][1]
    layer.__dict__["_fp8_workspaces"] = Exploding(layer.__dict__["_fp8_workspaces"])


@pytest.mark.subprocess(verl="0.8.0")
def test_clearing_that_raises_does_not_stop_the_offload(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim  # noqa: F401

    world = build(explode_one)
    r = offload(world, ENGINE)
    assert r["offloaded"] and r["same"]
    assert r["after"]["entries"] == 1, "the raising dict keeps its entry; the other 8 are cleared"
    assert r["stats"]["entries"] == 8 and r["stats"]["errors"] == 1
    assert caplog.text.count("clearing _fp8_workspaces at") == 1


@pytest.mark.subprocess(verl="0.8.0", env={"TE_OFFLOAD_SHIM_STRICT": "1"})
def test_clearing_that_raises_raises_in_strict_mode() -> None:
    import te_offload_shim  # noqa: F401

    world = build(explode_one)
    caller = importlib.import_module(ENGINE)
    with pytest.raises(Exception) as raised:
        caller.offload_megatron_model_to_cpu([world.model])
    assert type(raised.value).__name__ == "ShimError"
    assert all(b.param_data.untyped_storage().size() == 0 for b in world.model.buffers) is False


@pytest.mark.subprocess(verl="0.8.0")
def test_wrapped_offload_leaves_a_chunk_whose_megatron_config_turns_cuda_graphs_on() -> None:
    """The wrapped offload hands te/ Megatron's marks (integrations/megatron.py `CUDA_GRAPHS`, through
    engine/attributes.py): megatron-core's TransformerConfig on the DDP chunk says graphs are
    on, so its caches stay, and the offload runs."""
    import te_offload_shim  # noqa: F401

    world = build(lambda model: setattr(model.config, "cuda_graph_impl", "local"))
    r = offload(world, ENGINE)
    assert r["offloaded"] and r["same"]
    assert r["after"]["entries"] == r["initial"]["entries"] == 9, "nothing cleared"
    assert r["stats"]["entries"] == 0 and r["stats"]["skipped"] == 1
