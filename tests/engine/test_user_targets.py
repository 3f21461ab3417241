"""User-declared targets (`TE_OFFLOAD_SHIM_TARGETS`) and switching targets off (`TE_OFFLOAD_SHIM_DISABLE`).

Parsing is pure and tested in-process; patching runs in fresh interpreters on a real module the test
writes, with TE-layout stand-in layers (harness/te_standins.py).
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

TARGETS = Path(__file__).resolve().parents[1] / "hostile" / "targets"  # where `usermod` lives

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


def use_usermod() -> None:
    sys.path.insert(0, str(TARGETS))


def drive() -> dict[str, Any]:
    """Call each of the user's offload functions on TE-layout layers; what the shim saw."""
    import te_offload_shim as shim
    from harness import te_standins

    use_usermod()
    u = importlib.import_module("usermod.offload")

    def layers(k: int = 2) -> list:
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
    return {
        "flushes": [list(f) for f in u.FLUSHES],
        "stats": shim.stats(),
        "states": {t["name"]: t["state"] for t in status["targets"] if t["name"].startswith("usermod")},
        "problems": status["user_target_problems"],
    }


def test_parse_where_forms() -> None:
    from te_offload_shim.engine.schema import parse_where

    assert (parse_where("").root, parse_where("").path) == ("arg0", ())
    w = parse_where("self.model.get_models()")
    assert (w.root, w.path, w.call) == ("self", ("model", "get_models"), True)
    assert (parse_where("models.chunks").root, parse_where("models.chunks").path) == ("models", ("chunks",))
    for bad in ("self.model(", "()", "1x", "a-b", "self.get().model", "self..model", "x()"):
        with pytest.raises(ValueError):
            parse_where(bad)


def test_parse_user_targets_keeps_the_good_and_reports_the_bad() -> None:
    from te_offload_shim.integrations.user_targets import parse_user_targets

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
    from te_offload_shim.integrations.targets import BUILTIN

    names = [t.name for t in BUILTIN]
    assert len(names) == len(set(names))
    assert all(t.where.root in ("self", "models") for t in BUILTIN)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ",".join([*GOOD, *MALFORMED, "usermod.offload:missing"])})
def test_user_targets_patch_a_real_module(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    import te_offload_shim  # noqa: F401  (first)

    r = drive()
    assert r["flushes"] == [["offload", 0], ["pair", 0], ["holder", 0], ["engine", 0], ["arg", 0], ["strategy", 0]]
    assert r["stats"]["calls"] == 6 and r["stats"]["entries"] == 12
    assert {k: v["entries"] for k, v in r["stats"]["by_target"].items()} == {name: 2 for name in NAMES}
    assert r["states"] == {**{name: "patched" for name in NAMES}, "usermod.offload:missing": "absent"}
    assert len(r["problems"]) == len(MALFORMED)
    assert caplog.text.count(f"ignoring {'TE_OFFLOAD_SHIM_TARGETS'} entry") == len(MALFORMED)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD)})
def test_user_module_imported_before_the_shim() -> None:
    use_usermod()
    importlib.import_module("usermod.offload")
    assert "te_offload_shim" not in sys.modules
    r = drive()
    assert all(entries == 0 for _, entries in r["flushes"]) and r["stats"]["calls"] == 6


DISABLES = ["usermod.offload:offload,usermod.offload:Engine.offload", "*"]


def disabling(disable: str) -> Any:
    env = {"TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD), "TE_OFFLOAD_SHIM_DISABLE": disable}
    return pytest.param(disable, marks=pytest.mark.subprocess(env=env))


@pytest.mark.parametrize("disable", [disabling(d) for d in DISABLES])
def test_disable_user_targets(disable: str) -> None:
    import te_offload_shim  # noqa: F401  (first)

    r = drive()
    off = set(NAMES) if disable == "*" else set(disable.split(","))
    assert {k for k, v in r["states"].items() if v == "disabled"} == off
    flushes = dict(r["flushes"])
    assert flushes["offload"] == 2 and flushes["engine"] == 2, "disabled: left in place"
    if disable != "*":
        assert flushes["pair"] == flushes["strategy"] == 0, "the others still work"
        assert r["stats"]["calls"] == 4


@pytest.mark.subprocess(
    verl="0.8.0", env={"TE_OFFLOAD_SHIM_TARGETS": GOOD[0], "TE_OFFLOAD_SHIM_DISABLE": " verl , nemo-rl"}
)
def test_disable_verl_by_name_leaves_other_targets_on() -> None:
    import te_offload_shim as shim
    from harness import te_standins
    from te_offload_shim.engine.patch import shim_layers

    mu = importlib.import_module("verl.utils.megatron_utils")
    use_usermod()
    u = importlib.import_module("usermod.offload")
    m = te_standins.TELinearStandIn(8, 8)
    te_standins.fill_like_forward(m)
    u.offload([m])
    states = {t["name"]: t["state"] for t in shim.status()["targets"]}
    assert states["verl"] == "disabled" and shim_layers(mu.offload_megatron_model_to_cpu) == 0
    assert states["nemo-rl"] == "disabled" and states["megatron-core"] == "patched"
    assert states[GOOD[0]] == "patched" and [list(f) for f in u.FLUSHES] == [["offload", 0]]


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "renamed_itself:offload"})
def test_a_target_module_that_renames_itself_is_patched_by_the_name_it_was_imported_under(tmp_path: Path) -> None:
    """A module whose body sets its own `__name__`: the target names it as imported (its spec's name)."""
    from te_offload_shim.engine.patch import shim_layers

    (tmp_path / "renamed_itself.py").write_text(
        "__name__ = 'something_else'\n\ndef offload(models):\n    return models\n"
    )
    sys.path.insert(0, str(tmp_path))
    import te_offload_shim

    module = importlib.import_module("renamed_itself")
    assert module.__name__ == "something_else" and shim_layers(module.offload) == 1
    assert {t["name"]: t["state"] for t in te_offload_shim.status()["targets"]}["renamed_itself:offload"] == "patched"


def _offload(models: Any) -> Any:
    return models


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "made_by_hand:offload"})
def test_a_target_module_made_by_hand_without_a_spec_is_patched() -> None:
    """A module object a framework makes itself and puts in sys.modules (no spec, no loader), before
    the shim: patched when the shim installs."""
    from types import ModuleType

    module = ModuleType("made_by_hand")
    del module.__spec__  # not even None: made by hand, never imported
    module.offload = _offload  # type: ignore[attr-defined]
    sys.modules["made_by_hand"] = module
    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    assert not hasattr(module, "__spec__") and shim_layers(module.offload) == 1
    assert {t["name"]: t["state"] for t in te_offload_shim.status()["targets"]}["made_by_hand:offload"] == "patched"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ",".join([*GOOD, "usermod.offload:missing"])})
def test_only_a_user_target_that_cannot_be_patched_is_said_with_why(caplog: pytest.LogCaptureFixture) -> None:
    """One warning, for the user's target its module lacks: which, why, and what it costs; none for
    the targets that were patched."""
    caplog.set_level(logging.INFO, logger="te_offload_shim")
    import te_offload_shim  # noqa: F401  (first)

    use_usermod()
    importlib.import_module("usermod.offload")
    said = [r.getMessage().removeprefix("te_offload_shim: ") for r in caplog.records if "not patched" in r.getMessage()]
    assert said == [
        "usermod.offload:missing is not patched (usermod.offload has no attribute missing); "
        "its offload runs without clearing FP8 caches"
    ]


@pytest.mark.subprocess(
    env={"TE_OFFLOAD_SHIM_TARGETS": ",".join(GOOD[:2]), "TE_OFFLOAD_SHIM_DISABLE": "usermod.offload:offload"}
)
def test_status_says_a_disabled_target_is_disabled_and_nothing_more() -> None:
    """`status` rows, as the operator reads them: the disabled target says so, with no reason added
    (the switch is the reason), beside the patched one."""
    import te_offload_shim

    use_usermod()
    importlib.import_module("usermod.offload")
    rows = {r["name"]: (r["state"], r["detail"]) for r in te_offload_shim.status()["targets"]}
    assert rows["usermod.offload:offload"] == ("disabled", "")
    assert rows["usermod.offload:offload_pair"][0] == "patched"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "usermod.offload:offload,usermod.offload:offload@models"})
def test_a_function_two_targets_name_is_wrapped_once_and_both_say_patched() -> None:
    """Two entries for one function (a user's entry beside another for the same function): the
    second finds ours armed in place and stacks no second wrapper; both rows say patched."""
    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    use_usermod()
    module = importlib.import_module("usermod.offload")
    assert shim_layers(module.offload) == 1
    rows = [
        (r["state"], r["detail"]) for r in te_offload_shim.status()["targets"] if r["name"] == "usermod.offload:offload"
    ]
    assert rows == [("patched", ""), ("patched", "")]


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "usermod.offload:offload@nope.chunks"})
def test_a_models_spec_that_names_no_parameter_is_said_as_the_user_wrote_it() -> None:
    """The status row of a target whose `@where` names no parameter quotes the whole spec the user
    wrote (`nope.chunks`), not its first part."""
    import te_offload_shim

    use_usermod()
    importlib.import_module("usermod.offload")
    (row,) = [r for r in te_offload_shim.status()["targets"] if r["name"] == "usermod.offload:offload"]
    assert row["state"] == "error" and row["detail"].startswith(
        "models spec 'nope.chunks' names no parameter of offload("
    )


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "usermod.offload:offload"})
def test_our_disarmed_wrapper_found_in_place_at_a_new_install_is_replaced_not_wrapped() -> None:
    """A tool that wrapped our wrapper kept uninstall() from putting the original back, and later
    unwrapped, leaving our disarmed wrapper in place. The next install patches what it wraps: one
    layer of ours, and the next uninstall puts the original function back, not the old wrapper."""
    import functools

    import te_offload_shim
    from te_offload_shim.engine.patch import shim_layers

    use_usermod()
    module: Any = importlib.import_module("usermod.offload")
    ours = module.offload
    original = ours.__wrapped__
    module.offload = functools.wraps(ours)(lambda *a, **k: ours(*a, **k))  # a tracer wraps it after us
    te_offload_shim.uninstall()
    assert module.offload.__wrapped__ is ours  # not ours to undo: ours stays, disarmed
    module.offload = module.offload.__wrapped__  # the tracer steps back out
    assert te_offload_shim.install()
    (row,) = [r for r in te_offload_shim.status()["targets"] if r["name"] == "usermod.offload:offload"]
    assert row["state"] == "patched"
    assert module.offload is not ours and module.offload.__wrapped__ is original
    assert shim_layers(module.offload) == 1
    te_offload_shim.uninstall()
    assert module.offload is original


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "usermod.offload:offload"})
def test_a_patch_that_an_uninstall_overtook_lands_nothing_and_says_not_installed() -> None:
    """`apply` where the uninstall came first (the registry refuses the record: the race of
    tests/hostile/test_fork_and_uninstall.py made certain): nothing is put in place and its state
    says so."""
    import te_offload_shim
    from te_offload_shim.engine import registry
    from te_offload_shim.engine.patch import apply
    from te_offload_shim.integrations.user_targets import parse_user_targets

    use_usermod()
    module = importlib.import_module("usermod.offload")
    original = module.offload.__wrapped__
    te_offload_shim.uninstall()
    assert module.offload is original
    (target,), problems = parse_user_targets("usermod.offload:offload")
    assert problems == []
    assert apply(target, module) == ("not installed", "")
    assert registry.state(target.name) == ("not installed", "")
    assert module.offload is original and registry.records() == []
