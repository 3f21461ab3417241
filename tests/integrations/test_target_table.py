"""The target table as data: release declarations that parse and agree with the real releases, how
`status` matches an installed release against them (with `packaging`), and the one skip rule per entry.

In-process and cheap: the declarations against the source of the real verl releases in .deps (read,
not imported), and the skip rule through a real handler on TE-layout stand-in layers.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import FIXED_VERL, LEGACY_VERL, MIRRORS, REPO, UNFIXED_VERL, verl_path

from te_offload_shim.integrations import versions
from te_offload_shim.integrations.targets import BUILTIN, Target

TABLE = {t.name: t for t in BUILTIN}


def declaration_problems(target: Target) -> list[str]:
    """What is malformed in a target's release declaration (targets.py); [] when it is sound. A check
    of the table as written, for its contributors: no user can change it (`TE_OFFLOAD_SHIM_TARGETS`
    entries declare no releases), so `status` does not ask it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    problems = []
    if target.supported is not None:
        try:
            if not SpecifierSet(target.supported):
                problems.append(f"{target.name}: supported: {target.supported!r} matches every release (say None)")
        except InvalidSpecifier as exc:
            problems.append(f"{target.name}: supported: bad specifier: {exc}")
    if target.fixed_in is not None:
        try:
            Version(target.fixed_in)
        except InvalidVersion as exc:
            problems.append(f"{target.name}: fixed_in: {exc}")
    if (target.supported is not None or target.fixed_in is not None) and not target.distribution:
        problems.append(f"{target.name}: releases are declared without the distribution they are of")
    if (target.fixed_in is None) != (target.fixed_marker is None):
        problems.append(
            f"{target.name}: fixed_in and fixed_marker go together (the version for status, the marker at run time)"
        )
    if target.supported is None and target.distribution and not target.note:
        problems.append(f"{target.name}: no supported releases and no note saying which revisions have it")
    return problems


def test_installed_pre_releases_and_local_builds_count_as_the_release_they_are() -> None:
    """pip's rule for what is already installed (`prereleases=True`): a `0.9.1rc1` or a local build
    is inside `>=0.4.0`; packaging's default would call a pre-release outside every set that does not
    name one, and `status` would warn about a release the entry covers."""
    verl = TABLE["verl"]
    for installed, inside, fixed in [
        ("0.4.0", True, False), ("0.8.0+cu124", True, False), ("0.9.0rc1", True, False),
        ("0.9.0.dev0", True, False), ("0.9.0", True, True), ("0.9.1rc1", True, True),
        ("0.9.0.post1", True, True), ("0.3.0.post1", False, False),
    ]:  # fmt: skip
        assert versions.in_supported(verl, installed)[0] is inside, installed
        assert versions.fixed_upstream(verl, installed)[0] is fixed, installed
    assert versions.in_supported(TABLE["slime"], "0.3.1rc2")[0] is True  # <=0.3.1 takes its own rc


def test_unreadable_installed_version_is_unknown_not_a_failure() -> None:
    found, why = versions.in_supported(TABLE["verl"], "main")
    assert found is None and "Invalid version: 'main'" in why
    assert versions.fixed_upstream(TABLE["verl"], "main")[0] is None


@pytest.mark.parametrize("bad", ["0.9.0", "=>0.4", "<0.x", "~=1", ">=0.4.0;", ""])
def test_bad_specifiers_are_declaration_problems(bad: str) -> None:
    """What packaging refuses, and the empty set (which would match every release), is reported."""
    target = Target("bad", "m", "f", requires="d")
    target.supported = bad  # as read from `requires`: a string that is no requirement cannot say it
    problems = declaration_problems(target)
    assert len(problems) == 1 and problems[0].startswith("bad: supported: "), problems


@pytest.mark.subprocess(fresh=True)
def test_every_builtin_declaration_is_sound() -> None:
    assert [p for t in BUILTIN for p in declaration_problems(t)] == []
    assert all((t.skip is None or callable(t.skip)) for t in BUILTIN)


def test_malformed_declarations_are_reported_and_status_survives_them() -> None:
    cases = {
        "bad-spec": Target("bad-spec", "m", "f", requires="d=>0.4.0"),
        "bad-fix": Target("bad-fix", "m", "f", requires="d", fixed_in="0.9.x", fixed_marker="m"),
        "half-fix": Target("half-fix", "m", "f", requires="d>=1.0", fixed_in="2.0"),
        "no-dist": Target("no-dist", "m", "f", requires=">=1.0"),
        "silent": Target("silent", "m", "f", requires="d"),
    }
    for name, target in cases.items():
        assert declaration_problems(target), name
    assert "supported: bad specifier: Invalid specifier: '=>0.4.0'" in declaration_problems(cases["bad-spec"])[0]
    assert versions.in_supported(cases["bad-spec"], "1.0")[0] is None
    assert versions.fixed_upstream(cases["bad-fix"], "1.0")[0] is None


def _top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("release", [*LEGACY_VERL, *UNFIXED_VERL, *FIXED_VERL])
def test_verl_fixed_in_agrees_with_the_real_release(release: str) -> None:
    """The declared `fixed_in` (what `status` says without importing) against the marker the real
    release's module defines (what the patcher checks at run time)."""
    target = TABLE["verl"]
    root = verl_path(release)
    (info,) = root.glob("verl-*.dist-info")
    installed = info.name[len("verl-") : -len(".dist-info")]
    declared, _ = versions.fixed_upstream(target, installed)
    in_module = target.fixed_marker in _top_level_names(root / "verl" / "utils" / "megatron_utils.py")
    assert declared is in_module is (release in FIXED_VERL)
    assert versions.in_supported(target, installed)[0] is True


def test_skip_rules_leave_alone_with_a_reason_or_clear() -> None:
    cases: list[tuple[str, dict[str, Any], str | None]] = [
        ("megatron-core", {"move_params": False}, "move_params=False"),
        ("megatron-core", {"move_params": True}, None),
        ("megatron-core", {}, None),
        ("rlinf", {"offload_weight": False}, "offload_weight=False"),
        ("roll", {"include": ["optimizer_states"]}, "include names no model_params"),
        ("roll", {"include": None}, None),
        ("roll", {"include": "model_params"}, None),
        ("areal-awex", {"tags": ["optimizer"]}, "tags name no weights"),
        ("areal-awex", {"tags": []}, None),
        ("nemo-rl", {"self": SimpleNamespace(fp8_cfg={"force_clear_fp8_caches": True})}, "force_clear_fp8_caches"),
        ("nemo-rl", {"self": SimpleNamespace(fp8_cfg={})}, None),
        (
            "miles",
            {"self": SimpleNamespace(args=SimpleNamespace(clear_quantized_weight_workspaces_on_offload=1))},
            "on",
        ),
        ("miles", {"self": SimpleNamespace(args=SimpleNamespace())}, None),
    ]
    for name, call, reason in cases:
        skip = TABLE[name].skip
        assert skip is not None, name
        got = skip(call)
        if reason is None:
            assert got is None, (name, call, got)
        else:
            assert isinstance(got, str) and reason in got, (name, call, got)


def test_a_call_left_alone_is_counted_and_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    import inspect

    import torch

    from harness import te_standins as te
    from te_offload_shim.engine import handler
    from te_offload_shim.engine import stats as counters
    from te_offload_shim.engine.registry import Record

    def offload(models: list, weights: bool = True) -> str:
        return "offloaded"

    target = Target(
        "skipper", __name__, "offload", "models", skip=lambda call: None if call["weights"] else "weights=False"
    )
    record = Record("target", None, "offload", offload, target=target.name)
    wrapper = handler.Handler(target, inspect.signature(offload), "function", record)
    layer = te.TELinearStandIn(4, 4)
    counters.reset()
    try:
        with caplog.at_level(logging.DEBUG, logger="te_offload_shim"):
            for weights in (False, False, True):
                te.fill_like_forward(layer)
                before = len(layer._fp8_workspaces)
                assert wrapper(offload, None, ([torch.nn.Sequential(layer)],), {"weights": weights}) == "offloaded"
                assert len(layer._fp8_workspaces) == (before if not weights else 0)
        stats = counters.counts()
    finally:
        counters.reset()
    assert before > 0
    assert stats["left_alone"] == {"skipper": {"weights=False": 2}}
    assert stats["calls"] == 1 and stats["by_target"]["skipper"]["calls"] == 1
    left = [(r.levelno, r.getMessage()) for r in caplog.records if "left alone" in r.getMessage()]
    assert left == [(logging.DEBUG, f"{__name__}:offload: left alone: weights=False")] * 2, "expected: at DEBUG"


def _frameworks_table() -> list[list[str]]:
    lines = (REPO / "docs" / "frameworks.md").read_text().splitlines()
    header = lines.index(
        "| name | releases: `distribution` `supported` | entry point | models | left alone when | tested |"
    )
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_docs_frameworks_table_is_the_table() -> None:
    """docs/frameworks.md has one row per entry of `BUILTIN`, in its order, and each row says what the
    entry declares: its name, distribution, supported releases and fix, entry point, `where`, whether a
    skip rule or a fix marker leaves calls alone, and what it is tested against (a mirror's cited
    commits are in that mirror's file; a real package's row names its test file)."""
    rows = _frameworks_table()
    assert [row[0] for row in rows] == [f"`{t.name}`" for t in BUILTIN], "one row per entry, in the table's order"
    for (_, releases, entry, models, left_alone, tested), t in zip(rows, BUILTIN, strict=True):
        assert releases.startswith(f"`{t.distribution}`"), t.name
        if t.supported is None:
            assert "no release declared" in releases, t.name
        else:
            assert f"`{t.supported}`" in releases, t.name
        assert (f"fixed in {t.fixed_in}" in releases) if t.fixed_in else ("fixed in" not in releases), t.name
        shown = re.sub(r"\(.*\)$", "", _spans(entry)[0])  # `module:func(models)`: the call's arguments
        assert shown == t.path or (shown.startswith("...") and t.path.endswith(shown[3:])), (t.name, shown)
        assert _spans(models)[0] == t.where.text, t.name
        if t.resolve is not None:
            assert models != f"`{t.where.text}`", f"{t.name}: say what the resolver finds from its `where`"
        if t.fixed_marker is not None:
            assert f"`{t.fixed_marker}`" in left_alone and "not patched" in left_alone, t.name
        assert (left_alone == "never") is (t.skip is None and t.fixed_marker is None), t.name
        module_path = t.module.replace(".", "/") + ".py"
        mirrors = list(MIRRORS.glob(module_path)) + list(MIRRORS.glob(f"*/{module_path}"))  # a root per release
        if tested.startswith("mirror of"):
            assert mirrors, f"{t.name}: no mirror of {t.module} in tests/mirrors/"
            cited = re.findall(r"\b[0-9a-f]{8}\b", tested) or re.findall(r"\b\d+\.\d+\.\d+\b", tested)
            assert cited, t.name
            texts = [p.read_text() for p in mirrors]
            assert [c for c in cited if not any(c in text for text in texts)] == [], (
                f"{t.name}: not cited by its mirror"
            )
        else:
            assert tested.startswith("real "), f"{t.name}: {tested}"
            assert any(s.startswith("tests/") and s.endswith(".py") for s in _spans(tested)), t.name
            # a real package's releases the index does not serve may be mirrored too: say so, cite them
            assert bool(mirrors) is ("mirrors of" in tested), f"{t.name}: its mirrors, named or absent"
            cited = re.findall(r"\b[0-9a-f]{8}\b", tested)
            assert bool(cited) is bool(mirrors), t.name
            texts = [p.read_text() for p in mirrors]
            uncited = [c for c in cited if not any(c in text for text in texts)]
            assert uncited == [], f"{t.name}: not cited by its mirror"
