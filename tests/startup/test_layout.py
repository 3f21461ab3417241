"""The start-up path stays small, and the layout docs/architecture.md describes is the package's.

`import te_offload_shim` may load the facade and the import hook and nothing else (`_switches` too
when a switch is set); the module names it watches must be the table's; no module of the package
reaches another module's private names.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "te_offload_shim"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
START_UP = {"te_offload_shim", "te_offload_shim._hook", "te_offload_shim._version"}


def test_the_start_up_path_watches_exactly_the_modules_of_the_table() -> None:
    import te_offload_shim
    from te_offload_shim.integrations.targets import BUILTIN

    assert list(te_offload_shim.BUILTIN_MODULES) == list(dict.fromkeys(t.module for t in BUILTIN))


@pytest.mark.subprocess(fresh=True)
def test_import_loads_the_facade_and_the_hook_and_nothing_else() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == START_UP


def test_import_in_a_bare_interpreter_loads_the_facade_and_the_hook_and_nothing_else() -> None:
    """The same in a plain `python -c` (pytest's child has loaded logging and more already): a
    standard-library module brought in at start-up would cost every interpreter of a cluster."""
    import os
    import subprocess

    code = "import sys; before = set(sys.modules); import te_offload_shim; print(sorted(set(sys.modules) - before))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    env["PYTHONPATH"] = str(PACKAGE.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sorted(START_UP))


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_STRICT": "1"}, fresh=True)
def test_a_switch_set_adds_only_the_switches_module() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == START_UP | {"te_offload_shim._switches"}


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


def private_reaches(path: Path) -> list[str]:
    """Where the module at `path` reaches another module's private (underscore, not dunder) names:
    `from te_offload_shim.x import _y`, or `_y` read off a name bound by an import of the package
    (a module, `x._y`, or an object of one, `HOOK._y`). Underscore modules are the package's own."""
    tree = ast.parse(path.read_text())
    private = re.compile(r"^_(?!_)")
    imported: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("te_offload_shim"):
            for alias in node.names:
                if private.match(alias.name) and f"{node.module}.{alias.name}" not in MODULES:
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("te_offload_shim"):
                    imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private.match(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in imported and ast.unparse(node) not in MODULES:
                found.append(f"{path.name}:{node.lineno} reads {ast.unparse(node)}")
    return found


MODULES = {f"te_offload_shim.{p.stem}" for p in PACKAGE.glob("_*.py")} | {
    f"te_offload_shim.{p.parent.name}.{p.stem}" for p in PACKAGE.glob("*/_*.py")
}


def test_no_module_reaches_another_modules_private_names() -> None:
    """Each module's private names are its own: the others call it by public names (issue 41)."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in private_reaches(path)]
    assert found == [], found


def test_the_private_reach_check_sees_each_kind_of_reach(tmp_path: Path) -> None:
    """The check above must be able to fail: an import of a private name, a module's private name,
    an imported object's private attribute; a private module itself is no reach."""
    module = tmp_path / "reacher.py"
    module.write_text(
        "import te_offload_shim\n"
        "from te_offload_shim import _hook\n"
        "from te_offload_shim._hook import HOOK, _MODULE_DICT\n"
        "from te_offload_shim.engine import registry\n"
        "te_offload_shim._hook.HOOK\n"
        "te_offload_shim._hook.HOOK._lock\n"
        "HOOK._fired\n"
        "registry._records\n"
        "_hook.namespace\n"
    )
    assert [hit.split(" ", 1)[1] for hit in private_reaches(module)] == [
        "imports te_offload_shim._hook._MODULE_DICT",
        "reads te_offload_shim._hook.HOOK._lock",
        "reads HOOK._fired",
        "reads registry._records",
    ]
