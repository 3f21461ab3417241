"""The README and docs/ stay readable and true to the repository: lines that fit, every test and file
they name present, every link landing on a page and a heading that exist.

Read as text, in-process; the tests named are found by their `def` (ast), not by running pytest.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WIDTH = 120  # as ruff's line-length: a table row is one line however wide
# A file of this repository named in the text: tests/te/test_te_real.py, harness/te_import.py, tests/mirrors/
REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|te_offload_shim|harness|benchmarks|scripts|demo|docs)/[\w./-]*[\w/])")
# A test named by its file, or `::name` after one on the same line: ::test_x, ::test_x_*, ::test_x[*unpatch*]
TEST_REF = re.compile(r"(tests/[\w/]+\.py)?(::[\w*]+)(\[[^\]`]*\])?")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.fixture(params=PAGES, ids=_id)
def page(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_there_are_pages_besides_the_readme() -> None:
    assert len(PAGES) >= 5, [_id(p) for p in PAGES]


def test_no_line_is_wider_than_120_outside_tables(page: Path) -> None:
    wide = [
        f"{_id(page)}:{n}: {len(line)} characters"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if len(line) > WIDTH and not line.lstrip().startswith("|")
    ]
    assert wide == []


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }  # fmt: skip


def test_every_test_and_file_named_exists(page: Path) -> None:
    """`tests/x/test_y.py::test_z` (also `::test_z` after it on the same line, `test_z_*` and
    `test_z[param]`) names a test function that exists; every other path of this repository named
    (`harness/te_import.py`, `tests/mirrors/`) exists."""
    missing = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for path in REPO_PATH.findall(line):
            if not (REPO / path.rstrip("/")).exists():
                missing.append(f"{_id(page)}:{n}: {path}")
        current: str | None = None
        for file, name, _ in TEST_REF.findall(line):
            current = file or current
            if current is None:
                missing.append(f"{_id(page)}:{n}: {name} names no file")
            elif (REPO / current).is_file() and not fnmatch.filter(_test_names(REPO / current), name[2:]):
                missing.append(f"{_id(page)}:{n}: {current}{name}")
    assert missing == []


def _anchors(page: Path) -> set[str]:
    """The ids GitHub gives the headings: lower case, punctuation dropped, spaces made dashes."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_link_lands_on_a_page_and_a_heading(page: Path) -> None:
    broken = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # another site: not checked here
            file, _, anchor = target.partition("#")
            where = (page.parent / file).resolve() if file else page
            if not where.exists():
                broken.append(f"{_id(page)}:{n}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
                broken.append(f"{_id(page)}:{n}: {target} (no such heading)")
    assert broken == []
