"""A reloader that reloads every module of the package, not only the package itself, keeps every
patch and `uninstall()`'s undoing; the counters start afresh (docs/guarantees.md, "What a reload
keeps")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO
from hostile_util import cached_layer, held_by_another_thread, write_module


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "deeply_reloaded:offload"})
def test_reloading_every_module_of_the_package_keeps_the_patches(tmp_path: Path) -> None:
    """A reloader that reloads every module of the package (not only the package itself): the
    registry forgot every patch (uninstall() restored nothing), the wrapper class changed, so status
    saw no wrapper, and a reloaded target was patched by a wrapper no later check recognised."""
    import importlib
    import sys

    import te_offload_shim as shim

    write_module(tmp_path, "deeply_reloaded", "def offload(models):\n    return 'offloaded'\n")
    import deeply_reloaded  # type: ignore[import-not-found]

    layer = cached_layer()
    deeply_reloaded.offload([layer])
    for name in sorted(n for n in sys.modules if n == "te_offload_shim" or n.startswith("te_offload_shim.")):
        module = sys.modules.get(name)  # the package's reload builds its hook's second half anew
        if module is not None:
            importlib.reload(module)

    def row() -> tuple[str, int]:
        found = next(r for r in shim.status()["targets"] if r["name"] == "deeply_reloaded:offload")
        return found["state"], found["layers"]

    assert row() == ("patched", 1)
    assert shim.stats()["calls"] == 0, "the counters start afresh: no reload keeps a count"
    importlib.reload(deeply_reloaded)
    assert row() == ("patched", 1), "one wrapper on the reloaded target, recognised as ours"
    layer = cached_layer()
    deeply_reloaded.offload([layer])
    assert layer._fp8_workspaces == {}
    assert (shim.stats()["calls"], shim.stats()["entries"]) == (1, 1), "counted by the counters made anew"
    assert shim.uninstall() == 1
    assert type(deeply_reloaded.offload).__name__ == "function", "the original is back"
    assert row() == ("not installed", 0)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_DISABLE": "*"})
def test_reloading_every_module_keeps_the_flush_net_as_it_armed() -> None:
    """The flush net's wrappers stay in place through a reload of every module of the package, and
    so does what they read: what says they are armed (the net's status row), the layers its hooks
    noted (a layer built before the reload is cleared at the next flush: the search over the heap
    runs only when the net arms), and the sharding wrappers' marks integrations/flush.py told
    te/placement.py when TE was imported (a layer FSDP1 resharded, which looks like an offload but
    for its mark, keeps its caches)."""
    import importlib
    import sys

    import torch
    from support import net_case

    import te_offload_shim as shim

    te = net_case.load()
    offloaded, resharded = net_case.cached_linear(te, 0), net_case.cached_linear(te, 1)
    for name in sorted(n for n in sys.modules if n == "te_offload_shim" or n.startswith("te_offload_shim.")):
        module = sys.modules.get(name)
        if module is not None:
            importlib.reload(module)

    row = shim.status()["net"]
    assert (row["state"], row["live_layers"]) == ("armed", 2), row
    net_case.offload_like_megatron(offloaded)
    for param in resharded.parameters():  # FSDP1's reshard: storage freed under the views, marked
        param._fsdp_flattened = True  # type: ignore[attr-defined]
        param.data.untyped_storage().resize_(0)
    torch.cuda.empty_cache()
    assert (net_case.entries(offloaded), net_case.entries(resharded)) == (0, 1)
    assert shim.stats()["net"]["cleared_flushes"] == 1
    assert shim.uninstall() >= 1
    assert not hasattr(torch.cuda.empty_cache, "__wrapped__"), "the flush put back"


@pytest.mark.subprocess()
def test_a_reload_of_the_engines_attributes_keeps_what_the_integrations_told_it() -> None:
    """engine/attributes.py holds what integrations/ told the engine once, when it loaded: Megatron's
    CUDA-graph marks (handed to every clearing: without them a graphed Megatron chunk is cleared),
    Ray's keyword, and how to find the class behind a `@ray.remote` class. A reload of that module
    alone keeps them: integrations/ does not tell them again."""
    import importlib
    from types import ModuleType, SimpleNamespace

    from te_offload_shim.engine import attributes
    from te_offload_shim.integrations import megatron, ray

    class Worker:
        def offload(self) -> None: ...

    module = ModuleType("actors")
    actor = SimpleNamespace(__ray_metadata__=SimpleNamespace(modified_class=Worker))  # an ActorClass's shape
    setattr(module, "Worker", actor)  # noqa: B010
    importlib.reload(attributes)
    assert attributes.cuda_graphs() is megatron.CUDA_GRAPHS, "Megatron's graph marks kept"
    assert ray.TRACE_CTX_KEYWORD in attributes.ignored_keywords, "Ray's keyword kept"
    assert attributes.owner_of(module, "Worker.offload") == (Worker, "offload"), "the class finder kept"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_LOG": "info"})
def test_a_reload_of_the_log_module_keeps_its_handler_and_the_locks_it_made(capfd: pytest.CaptureFixture[str]) -> None:
    """`_log`'s own stderr handler is put on the logger, outside the module: after a reload of `_log`
    it is still the one taken off when the application configures logging, so each line is printed
    once. `_locks` keeps the list of every lock: after its reload a lock made before (the registry's)
    is still seen held, and still re-initialised in a forked child."""
    import importlib
    import logging
    import os

    from te_offload_shim import _locks, _log
    from te_offload_shim.engine import registry

    for handler in list(logging.getLogger().handlers):  # no handler of the application's (pytest's off)
        logging.getLogger().removeHandler(handler)
    _log.log(logging.INFO, "te_offload_shim: before")
    importlib.reload(_log)
    logging.basicConfig(format="app %(message)s")  # the application's own, configured afterwards
    _log.log(logging.WARNING, "te_offload_shim: after")
    assert capfd.readouterr().err.splitlines() == ["te_offload_shim: before", "app te_offload_shim: after"]

    importlib.reload(_locks)
    with registry.lock:
        assert _locks.held_here(), "the registry's lock, made before the reload, is seen held"
    with held_by_another_thread(registry.lock):
        child = os.fork()
        if child == 0:  # the child: no thread holds the lock there
            os._exit(0 if registry.lock.acquire(timeout=5) else 1)
        assert os.waitpid(child, 0)[1] == 0, "the lock another thread held was re-initialised in the child"


def test_the_holders_a_reload_keeps_are_those_listed() -> None:
    """Every `kept(globals(), "name", ...)` of the package is a row of docs/guarantees.md's "What a
    reload keeps", and every name there is kept: a holder is kept only where the page says why."""
    package = REPO / "te_offload_shim"
    in_code = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            # `kept(globals(), "name", make)`, and the hook's own `globals().get("name")` (the start-up
            # imports no `_reload`)
            kept_call = getattr(node.func, "id", None) == "kept"
            if kept_call or ast.unparse(node.func) == "globals().get":
                name = node.args[1 if kept_call else 0]
                assert isinstance(name, ast.Constant), f"{path}: kept() of a name that is no literal"
                in_code.add((path.relative_to(package).as_posix(), name.value))
    text = (REPO / "docs" / "guarantees.md").read_text()
    section = text[text.index("## What a reload keeps") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    listed = set()
    for module, names in re.findall(r"^\| `([\w/]+\.py)` \| ([^|]+) \|", section, re.MULTILINE):
        listed |= {(module, name) for name in re.findall(r"`(\w+)`", names)}
    assert in_code == listed
