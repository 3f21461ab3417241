"""Every skip for a missing set-up goes through tests/support/set_up.py (`needs` / `missing`), whose
reasons end with "(run scripts/setup-env.sh)": only those does `CI=true` turn into failures. A skip
that says the same in its own words would let CI leave evidence out unseen.

A static check of the tests' and the harness's source: a skip (`pytest.skip`, `pytest.importorskip`,
`pytest.mark.skip` / `skipif`) outside set_up.py fails it when it is about a missing set-up: it
imports a package, it runs where an import failed, or its reason, its condition or the `if` above it
names a `.deps` folder (a literal, `DEPS`, or a module-level name built from one), `setup-env`, a
package "not installed", or a module `find_spec` did not find.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SET_UP = REPO / "tests" / "support" / "set_up.py"
MIRRORS = REPO / "tests" / "mirrors"  # other projects' code, not this suite's
WORDS = (".deps", "setup-env", "not installed")
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _sources() -> dict[str, str]:
    files = [*(REPO / "tests").rglob("*.py"), *(REPO / "harness").rglob("*.py")]
    return {
        str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
        for p in sorted(files)
        if p not in (SET_UP, Path(__file__).resolve()) and MIRRORS not in p.parents  # this file's are samples
    }


def _skip_kind(call: ast.Call) -> str | None:
    """`skip`, `importorskip` or `skipif` where `call` is pytest's (`pytest.x(...)`, `pytest.mark.x(...)`)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("skip", "skipif", "importorskip"):
        return None
    root = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return func.attr if isinstance(root, ast.Name) and root.id == "pytest" else None


def _set_up_names(trees: dict[str, ast.Module]) -> set[str]:
    """`DEPS` and every module-level name whose value names a `.deps` path or such a name."""
    names = {"DEPS"}
    while True:
        found = {
            target.id
            for tree in trees.values()
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and _mentions(node.value, names)
        }
        if found <= names:
            return names
        names |= found


def _mentions(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` names a missing set-up."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and any(w in sub.value for w in WORDS):
            return True
        if (isinstance(sub, ast.Name) and sub.id in names) or (isinstance(sub, ast.Attribute) and sub.attr in names):
            return True
        if isinstance(sub, ast.Compare) and isinstance(sub.left, ast.Call) and isinstance(sub.ops[0], ast.Is):
            func = sub.left.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            comparator = sub.comparators[0]
            if name == "find_spec" and isinstance(comparator, ast.Constant) and comparator.value is None:
                return True
    return False


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in IMPORT_ERRORS for t in types)


def offenders(sources: dict[str, str]) -> list[str]:
    """`file:line: why` for each skip about a missing set-up that does not go through set_up.py."""
    trees = {name: ast.parse(src, name) for name, src in sources.items()}
    names = _set_up_names(trees)
    found = []
    for name, tree in trees.items():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for call in ast.walk(tree):
            kind = _skip_kind(call) if isinstance(call, ast.Call) else None
            if kind is None:
                continue
            assert isinstance(call, ast.Call)
            guards: list[ast.AST] = [*call.args, *(k.value for k in call.keywords)]
            why = "imports a package" if kind == "importorskip" else None
            node: ast.AST = call
            while why is None and node in parents and not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                node = parents[node]
                if isinstance(node, ast.If):
                    guards.append(node.test)
                elif isinstance(node, ast.ExceptHandler) and _catches_import_error(node):
                    why = "runs where an import failed"
            if why is None and any(_mentions(g, names) for g in guards):
                why = "its reason or condition is about a missing set-up"
            if why is not None:
                found.append(f"{name}:{call.lineno}: pytest.{kind} {why}")
    return found


def test_every_set_up_skip_goes_through_set_up_py() -> None:
    found = offenders(_sources())
    assert not found, "skip through tests/support/set_up.py (needs / missing), so CI=true fails it:\n" + "\n".join(
        found
    )


# Each of these skips is about a missing set-up, in its own words: the check finds every one
SAYS_IT_ITSELF = {
    "its reason": """
        def test():
            pytest.skip(".deps/x is missing: run scripts/setup-env.sh")
    """,
    "a name built from a .deps path": """
        DS = Path(".deps") / "ds"
        PKG = DS / "pkg"

        def test():
            if not PKG.is_dir():
                pytest.skip("no DeepSpeed")
    """,
    "DEPS": """
        @pytest.mark.skipif(not DEPS.is_dir(), reason="nothing")
        def test(): ...
    """,
    "not installed": """
        @pytest.mark.skip(reason="verl not installed")
        def test(): ...
    """,
    "importorskip": """
        def test():
            pytest.importorskip("deepspeed")
    """,
    "an import failed": """
        def test():
            try:
                import ray
            except (OSError, ModuleNotFoundError):
                pytest.skip("no ray")
    """,
    "find_spec": """
        @pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="no ray")
        def test(): ...
    """,
}
# And these are not: set_up.py's own, and what a machine cannot do
FINE = {
    "needs": """
        def test():
            needs(DS / "deepspeed", "DeepSpeed not installed")
    """,
    "missing": """
        pytestmark = [missing("ms-swift not installed in .deps")]
    """,
    "a platform": """
        @pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
        def test(): ...
    """,
    "present": """
        def test():
            if importlib.util.find_spec("te_torch") is not None:
                pytest.skip("installed here")
    """,
}


def test_the_check_finds_a_set_up_skip_in_each_form_and_nothing_else() -> None:
    for form, source in SAYS_IT_ITSELF.items():
        assert offenders({form: textwrap.dedent(source)}), f"not found: {form}"
    for form, source in FINE.items():
        assert not offenders({form: textwrap.dedent(source)}), f"taken for a set-up skip: {form}"
