"""The residue report's walk over what a model refers to reads types, never runs the model's code.

A model may hold anything: a `wrapt.LazyObjectProxy` (a service created on first use, a client, a
lazily loaded tokenizer) runs its factory at the first attribute read of any kind, `hasattr`, a
`__dict__` read and `isinstance`'s `__class__` fallback included. With `TE_OFFLOAD_SHIM_AUDIT` on,
every wrapped offload walks the model: the factory must never run, in `residue()` either.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from hostile_util import cached_layer, load_lazily, use_targets, write_module


def _model_with_lazy_services(made: list[str]) -> object:
    import torch
    import wrapt

    def factory() -> object:
        made.append("service")  # what the application's factory would do: connect, load, allocate
        return {"client": torch.ones(4)}

    # Held in containers and plain objects, as `self.services = {...}` holds them. (A proxy assigned
    # to a module attribute directly is made by torch's own `__setattr__`, whose isinstance asks it.)
    model: Any = torch.nn.Sequential(cached_layer())
    model.services = {"tokenizer": wrapt.LazyObjectProxy(factory)}
    model.clients = [wrapt.LazyObjectProxy(factory)]
    model.state = types.SimpleNamespace(client=wrapt.LazyObjectProxy(factory))
    model.weight_copy = torch.ones(8)  # a tensor outside parameters and buffers: "other", still found
    return model


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload", "TE_OFFLOAD_SHIM_AUDIT": "cpu"})
def test_the_audit_never_runs_a_lazy_proxys_factory() -> None:
    import te_offload_shim as shim

    made: list[str] = []
    model = _model_with_lazy_services(made)
    use_targets()
    import shim_targets  # type: ignore[import-not-found]

    assert shim_targets.offload([model]) == "offloaded"
    latest = shim.stats()["audit"]
    assert latest is not None and latest["audits"] == 1, latest
    assert made == [], "the audit ran the factory of a lazy proxy the model holds"
    assert latest["other"] == {"weight_copy": 8 * 4}, latest["other"]


@pytest.mark.subprocess()
def test_residue_never_runs_a_lazy_proxys_factory() -> None:
    import te_offload_shim as shim

    made: list[str] = []
    model = _model_with_lazy_services(made)
    report = shim.residue([model], device_type="cpu")
    assert made == [], "residue() ran the factory of a lazy proxy the model holds"
    assert report.errors == [], report.errors
    assert report.other == {"weight_copy": 8 * 4}, report.other


@pytest.mark.subprocess()
def test_the_residue_walk_reads_only_types(tmp_path: Path) -> None:
    import builtins

    import torch

    import te_offload_shim as shim

    write_module(tmp_path, "referred_lazily", "import builtins\nbuiltins.REFERRED_LAZILY_RAN = True\n")
    lazy = load_lazily("referred_lazily")

    class Unconfigured:
        @property  # type: ignore[misc]  # deliberately: a __class__ that raises, as Django's LazyObject's
        def __class__(self) -> type:
            raise RuntimeError("settings are not configured")

    layer = torch.nn.Linear(4, 4)
    layer.__dict__["helpers"] = lazy  # a module kept on a layer (a kernel library, lazily imported)
    layer.__dict__["nested"] = {"helpers": lazy}
    layer.__dict__["settings"] = Unconfigured()
    layer.__dict__["weight_copy"] = torch.ones(8)  # a tensor outside parameters and buffers: "other"
    report = shim.residue([layer], device_type="cpu")
    assert not hasattr(builtins, "REFERRED_LAZILY_RAN"), "the report executed a module the application did not"
    assert report.errors == [], report.errors
    assert report.by_category["parameters"] == (16 + 4) * 4
    assert report.by_category["other"] == 8 * 4, "the attributes after the odd one were walked"
