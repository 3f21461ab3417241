"""Scenarios 6 and 7: the wrapper is invisible to pickle and copy, and binds static and class
methods as Python does. Each test runs in a fresh interpreter with real user targets patched."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_util import ALL_KINDS, TARGETS, cached_layer, use_targets

TARGET_ENV = {"TE_OFFLOAD_SHIM_TARGETS": ALL_KINDS}


def _disassembly(data: bytes) -> str:
    """The pickle's opcodes, for an assertion message (`pickletools.dis` prints them and returns None)."""
    out = io.StringIO()
    pickletools.dis(data, out)
    return out.getvalue()


def _load_in_bare_python(data: bytes, tmp_path: Path) -> str:
    """Unpickle in an interpreter that has neither this package nor wrapt: no site-packages, and
    only the target modules on the path."""
    blob = tmp_path / "blob.pickle"
    blob.write_bytes(data)
    env = {"PYTHONPATH": str(TARGETS), "PATH": os.environ.get("PATH", "")}
    script = Path(__file__).resolve().parent / "unpickle_bare.py"
    proc = subprocess.run([sys.executable, "-S", str(script), str(blob)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.subprocess(env=TARGET_ENV)
def test_patched_functions_and_bound_methods_pickle_by_reference(tmp_path: Path) -> None:
    import cloudpickle

    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    use_targets()
    import shim_targets as t

    assert shim_layers(t.offload) == 1 and shim_layers(vars(t.Engine)["offload"]) == 1
    engine = t.Engine()
    for lib in (pickle, cloudpickle):
        for obj in (t.offload, engine.offload, t.Engine.offload, t.Engine.static_offload, t.Engine.class_offload):
            data = lib.dumps(obj)
            assert b"te_offload_shim" not in data and b"wrapt" not in data, (obj, _disassembly(data))
            back = pickle.loads(data)
            assert shim_layers(back) == 1, f"{obj!r} loads as the patched attribute of this process"
    assert pickle.loads(pickle.dumps(t.offload)) is t.offload
    bound = pickle.loads(pickle.dumps(engine.offload))
    layer = cached_layer()
    assert bound([layer]) == "method" and layer._fp8_workspaces == {}, "a bound method unpickles still patched"
    # Where neither te_offload_shim nor wrapt is installed, the same bytes load the plain original.
    assert _load_in_bare_python(pickle.dumps(t.offload), tmp_path) == "offloaded"
    assert _load_in_bare_python(cloudpickle.dumps(t.Engine.static_offload), tmp_path) == "static"
    assert te_offload_shim.status()["hook_errors"] == []


@pytest.mark.subprocess(env=TARGET_ENV)
def test_copy_and_deepcopy_return_the_function_itself() -> None:
    import copy
    import dataclasses

    import te_offload_shim  # noqa: F401

    use_targets()
    import shim_targets as t

    @dataclasses.dataclass
    class Hooks:
        offload: object

    engine = t.Engine()
    for obj in (t.offload, engine.offload, t.Engine.static_offload):
        assert copy.copy(obj) is obj and copy.deepcopy(obj) is obj
    holder: dict[str, Any] = {"fn": t.offload, "hooks": Hooks(t.offload)}
    deep = copy.deepcopy(holder)
    assert deep["fn"] is t.offload and deep["hooks"].offload is t.offload
    assert dataclasses.replace(Hooks(t.offload)).offload is t.offload


@pytest.mark.subprocess(env=TARGET_ENV)
def test_static_and_class_method_targets_clear_their_models_argument() -> None:
    import te_offload_shim

    use_targets()
    import shim_targets as t

    states = {r["target"]: r["state"] for r in te_offload_shim.status()["targets"] if r["name"].startswith("shim")}
    assert states["shim_targets:Engine.static_offload"] == "patched"
    assert states["shim_targets:Engine.class_offload"] == "patched"
    first, second = cached_layer(), cached_layer()
    # A static method's first argument is `models`: nothing is counted after a `self` it lacks.
    assert t.Engine.static_offload([first], second) == second
    assert first._fp8_workspaces == {} and second._fp8_workspaces, "models cleared, the tag argument left alone"
    third = cached_layer()
    assert t.Engine().static_offload([third]) == "static" and third._fp8_workspaces == {}
    # A class method gets its class, and `arg0` is the argument after it.
    fourth, fifth = cached_layer(), cached_layer()
    assert t.Engine.class_offload([fourth]) == "Engine:class" and fourth._fp8_workspaces == {}
    assert t.Engine().class_offload(models=[fifth], tag="x") == "Engine:x" and fifth._fp8_workspaces == {}
    assert [c[0] for c in t.CALLS] == [second, "static", "class", "x"]
    assert te_offload_shim.stats()["entries"] == 4
