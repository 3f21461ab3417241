"""The start-up path stays small, and the layout docs/architecture.md describes is the package's.

`import te_offload_shim` may load one module of ours and nothing else (`_switches` too when a
switch is set); the module names it watches must be the table's.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "te_offload_shim"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def test_the_start_up_path_watches_exactly_the_modules_of_the_table() -> None:
    import te_offload_shim
    from te_offload_shim.integrations.targets import BUILTIN

    assert list(te_offload_shim.BUILTIN_MODULES) == list(dict.fromkeys(t.module for t in BUILTIN))


@pytest.mark.subprocess(fresh=True)
def test_import_loads_one_module_of_ours_and_nothing_else() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == {"te_offload_shim"}


def test_import_in_a_bare_interpreter_loads_one_module_and_nothing_else() -> None:
    """The same in a plain `python -c` (pytest's child has loaded logging and more already): a
    standard-library module brought in at start-up would cost every interpreter of a cluster."""
    import os
    import subprocess

    code = "import sys; before = set(sys.modules); import te_offload_shim; print(sorted(set(sys.modules) - before))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    env["PYTHONPATH"] = str(PACKAGE.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['te_offload_shim']"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_STRICT": "1"}, fresh=True)
def test_a_switch_set_adds_only_the_switches_module() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == {"te_offload_shim", "te_offload_shim._switches"}


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM": "0"})
def test_switched_off_at_start_up_installs_nothing() -> None:
    import te_offload_shim

    assert not te_offload_shim.installed()
    assert te_offload_shim.install() is False


def test_report_types_are_exported_lazily_and_typed() -> None:
    import te_offload_shim
    from te_offload_shim.engine import status
    from te_offload_shim.te import caches

    assert te_offload_shim.CacheReport is caches.CacheReport
    assert te_offload_shim.ShimError is caches.ShimError
    assert te_offload_shim.Status is status.Status
    assert set(te_offload_shim.__all__) >= {"CacheReport", "Skipped", "ShimError", "ResidueReport", "Status", "Stats"}
    assert {"status", "uninstall", "scan", "CacheReport"} <= set(dir(te_offload_shim)), "dir() lists the lazy names"
    assert te_offload_shim.uninstall.__module__ == "te_offload_shim.api"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        te_offload_shim.nope  # noqa: B018
    row_keys = set(status.TargetRow.__annotations__)
    assert row_keys == set(te_offload_shim.status()["targets"][0])
    assert set(status.Stats.__annotations__) == set(te_offload_shim.stats())


def test_every_module_of_the_package_is_in_the_architecture_page() -> None:
    """A newcomer finds each module in docs/architecture.md's "Modules" section, and nothing listed
    there is gone."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Modules") :]
    section = section[: section.index("\n## ", 1)]
    listed = set(re.findall(r"`(te_offload_shim/[\w/]+\.py)`", section))
    present = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}
    present = {p for p in present if not p.endswith("/__init__.py") or p == "te_offload_shim/__init__.py"}
    assert present - listed == set(), "modules missing from docs/architecture.md's Modules section"
    assert listed - present == set(), "docs/architecture.md's Modules section names modules that do not exist"


def test_the_start_up_declares_the_signatures_of_the_api() -> None:
    """`__init__.py` declares `api`'s functions for type checkers instead of importing `api` (which
    reads the start-up's install state): each declaration says what api.py says."""

    def functions(tree: ast.AST) -> dict[str, str]:
        return {
            node.name: f"({ast.unparse(node.args)}) -> {ast.unparse(node.returns) if node.returns else None}"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
        }

    start_up = ast.parse((PACKAGE / "__init__.py").read_text())
    (block,) = [n for n in start_up.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    declared = functions(ast.Module(body=block.body, type_ignores=[]))
    api = functions(ast.parse((PACKAGE / "api.py").read_text()))
    import te_offload_shim

    exported = {name for name, module in te_offload_shim._EXPORTS.items() if module == "te_offload_shim.api"}
    assert set(declared) == exported, "every function exported from api is declared, and nothing else"
    assert {name: api[name] for name in declared} == declared


def test_packaging_is_imported_only_by_status_and_only_when_it_runs() -> None:
    """`packaging` (the table's specifiers) is a dependency of `status` alone: one module imports
    it, inside a function, so neither start-up nor a patched process ever loads it for the shim."""
    importers = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "packaging" or n.startswith("packaging.") for n in names):
                importers[str(path.relative_to(PACKAGE))] = id(node) in top_level
    assert importers == {"integrations/versions.py": False}, "imported at a module's top, or elsewhere"


def test_only_the_start_up_module_writes_the_hooks_state() -> None:
    """The start-up module owns the install state and the hook's (issue 30): no other module assigns
    to, deletes or mutates a private name of it (`_shim._watched = ...`, `_shim._fired.clear()`)."""
    writes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                targets = [node.func.value]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    target = target.value
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_")
                    and isinstance(target.value, ast.Name)
                    and target.value.id in ("_shim", "te_offload_shim", "shim")
                    and (not isinstance(node, ast.Call) or node.func.attr in MUTATORS)  # type: ignore[attr-defined]
                ):
                    writes.append(f"{path.name}:{getattr(node, 'lineno', 0)} {target.attr}")
    assert writes == [], writes


MUTATORS = {"pop", "clear", "update", "setdefault", "add", "discard", "remove", "append", "popitem"}
