"""User-declared targets (`TE_OFFLOAD_SHIM_TARGETS`) and switching targets off (`TE_OFFLOAD_SHIM_DISABLE`).

Parsing is pure and tested in-process; patching runs in fresh interpreters on a real module the test
writes, with TE-layout stand-in layers (harness/te_standins.py).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, run_py

from te_offload_shim.integrations.targets import BUILTIN, parse_user_targets, parse_where

USER_MODULE = '''
"""Offload functions of a user's own trainer: each records what is cached at its own flush."""
from harness.megatron_world import cache_state

FLUSHES = []


def offload(models):
    FLUSHES.append(("offload", cache_state(models)["entries"]))


def offload_pair(tag, models):
    FLUSHES.append((tag, cache_state(models)["entries"]))


def offload_holder(models):
    FLUSHES.append(("holder", cache_state(models.chunks)["entries"]))


class Holder:
    def __init__(self, chunks):
        self.chunks = chunks


class Engine:
    def __init__(self, models):
        self.model = models

    def offload(self):
        FLUSHES.append(("engine", cache_state(self.model)["entries"]))

    def offload_arg(self, tag, models):
        FLUSHES.append((tag, cache_state(models)["entries"]))


class Virtual:
    def __init__(self, models):
        self.models = models

    def get_models(self):
        return self.models


class Strategy:
    def __init__(self, models):
        self.model = Virtual(models)

    def offload_states(self, include=None):
        FLUSHES.append(("strategy", cache_state(self.model.get_models())["entries"]))
'''

GOOD = [
    "usermod.offload:offload",
    "usermod.offload:offload_pair@arg1",
    "usermod.offload:offload_holder@models.chunks",
    "usermod.offload:Engine.offload@self.model",
    "usermod.offload:Engine.offload_arg@arg1",
    "usermod.offload:Strategy.offload_states@self.model.get_models()",
]
NAMES = [entry.partition("@")[0] for entry in GOOD]  # a user target is named by its path, without @where
MALFORMED = [
    "nocolon",
    "usermod.offload:",
    "usermod..offload:offload",
    "usermod.offload:A.b.c",
    "usermod.offload:offload@self.model(",
    "usermod.offload:offload@()",
    "usermod.offload:offload@1x",
    "usermod.offload:offload@self.get().model",
    "import os:system",
]

DRIVE = """
from harness import te_standins
import usermod.offload as u

def layers(k=2):
    out = []
    for _ in range(k):
        m = te_standins.TELinearStandIn(8, 8)
        te_standins.fill_like_forward(m)
        out.append(m)
    return out

u.offload(layers())
u.offload_pair("pair", layers())
u.offload_holder(u.Holder(layers()))
u.Engine(layers()).offload()
u.Engine(layers()).offload_arg("arg", models=layers())
u.Strategy(layers()).offload_states()
status = shim.status()
emit(flushes=u.FLUSHES, stats=shim.stats(),
     states={t["name"]: t["state"] for t in status["targets"] if t["name"].startswith("usermod")},
     problems=status["user_target_problems"])
"""


@pytest.fixture
def user_path(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "usermod"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "offload.py").write_text(textwrap.dedent(USER_MODULE))
    paths = [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join([*paths, str(tmp_path), str(REPO)])}


def test_parse_where_forms() -> None:
    assert (parse_where("").root, parse_where("").path) == ("arg0", ())
    w = parse_where("self.model.get_models()")
    assert (w.root, w.path, w.call) == ("self", ("model", "get_models"), True)
    assert (parse_where("models.chunks").root, parse_where("models.chunks").path) == ("models", ("chunks",))
    for bad in ("self.model(", "()", "1x", "a-b", "self.get().model", "self..model", "x()"):
        with pytest.raises(ValueError):
            parse_where(bad)


def test_parse_user_targets_keeps_the_good_and_reports_the_bad() -> None:
    targets, problems = parse_user_targets(", ".join(GOOD[:2] + MALFORMED + GOOD[2:]) + ",,")
    assert [t.name for t in targets] == NAMES, "order kept, malformed ones dropped, empty ones ignored"
    assert [t.where.text for t in targets] == [
        "",
        "arg1",
        "models.chunks",
        "self.model",
        "arg1",
        "self.model.get_models()",
    ]
    assert len(problems) == len(MALFORMED)
    for entry, problem in zip(MALFORMED, problems, strict=True):
        assert problem.startswith(repr(entry)), problem


def test_builtin_names_are_unique_and_where_specs_parse() -> None:
    names = [t.name for t in BUILTIN]
    assert len(names) == len(set(names))
    assert all(t.where.root in ("self", "models") for t in BUILTIN)


def test_user_targets_patch_a_real_module(user_path: dict[str, str]) -> None:
    env = {**user_path, "TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD + MALFORMED + ["usermod.offload:missing"])}
    r = run_py("import te_offload_shim as shim\n" + DRIVE, env=env)
    assert r["flushes"] == [["offload", 0], ["pair", 0], ["holder", 0], ["engine", 0], ["arg", 0], ["strategy", 0]]
    assert r["stats"]["calls"] == 6 and r["stats"]["entries"] == 12
    assert {k: v["entries"] for k, v in r["stats"]["by_target"].items()} == {name: 2 for name in NAMES}
    assert r["states"] == {**{name: "patched" for name in NAMES}, "usermod.offload:missing": "absent"}
    assert len(r["problems"]) == len(MALFORMED)
    assert r["_stderr"].count(f"ignoring {'TE_OFFLOAD_SHIM_TARGETS'} entry") == len(MALFORMED)


def test_user_module_imported_before_the_shim(user_path: dict[str, str]) -> None:
    code = "import usermod.offload\nimport te_offload_shim as shim\n" + DRIVE
    r = run_py(code, env={**user_path, "TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD)})
    assert all(entries == 0 for _, entries in r["flushes"]) and r["stats"]["calls"] == 6


@pytest.mark.parametrize("disable", ["usermod.offload:offload,usermod.offload:Engine.offload", "*"])
def test_disable_user_targets(user_path: dict[str, str], disable: str) -> None:
    env = {**user_path, "TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD), "TE_OFFLOAD_SHIM_DISABLE": disable}
    r = run_py("import te_offload_shim as shim\n" + DRIVE, env=env)
    off = set(NAMES) if disable == "*" else set(disable.split(","))
    assert {k for k, v in r["states"].items() if v == "disabled"} == off
    flushes = dict(r["flushes"])
    assert flushes["offload"] == 2 and flushes["engine"] == 2, "disabled: left in place"
    if disable != "*":
        assert flushes["pair"] == flushes["strategy"] == 0, "the others still work"
        assert r["stats"]["calls"] == 4


def test_disable_verl_by_name_leaves_other_targets_on(user_path: dict[str, str]) -> None:
    code = """
import te_offload_shim as shim
import verl.utils.megatron_utils as mu
from te_offload_shim.engine.patch import shim_layers
from harness import te_standins
import usermod.offload as u
m = te_standins.TELinearStandIn(8, 8)
te_standins.fill_like_forward(m)
u.offload([m])
emit(states={t["name"]: t["state"] for t in shim.status()["targets"]},
     layers=shim_layers(mu.offload_megatron_model_to_cpu), flushes=u.FLUSHES)
"""
    env = {**user_path, "TE_OFFLOAD_SHIM_TARGETS": GOOD[0], "TE_OFFLOAD_SHIM_DISABLE": " verl , nemo-rl"}
    paths = env["PYTHONPATH"] + os.pathsep + str(REPO / ".deps" / "verl-0.8.0")
    if not (REPO / ".deps" / "verl-0.8.0" / "verl").is_dir():
        pytest.skip("verl 0.8.0 not installed (run scripts/setup-env.sh)")
    r = run_py(code, env={**env, "PYTHONPATH": paths})
    assert r["states"]["verl"] == "disabled" and r["layers"] == 0
    assert r["states"]["nemo-rl"] == "disabled" and r["states"]["megatron-core"] == "patched"
    assert r["states"][GOOD[0]] == "patched" and r["flushes"] == [["offload", 0]]
