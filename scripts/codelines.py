"""Code lines of the package (issue 35's budgets): lines holding a token that is no comment, no
docstring and no blank. `python3 scripts/codelines.py` prints the package's total;
`python3 scripts/codelines.py FILES...` the total of those files. What a training process loads is
measured by tests/tools/test_code_budget.py (a real verl offload on TE's twin)."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_offload_shim"
RUNTIME_BUDGET = 2_500  # what a training process loads
PACKAGE_BUDGET = 4_200  # the whole package
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(path: str | Path) -> int:
    """The lines of `path` holding a token that is no comment and not part of a docstring."""
    src = Path(path).read_text(encoding="utf-8")
    doc: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in _SKIP:
            lines.update(ln for ln in range(tok.start[0], tok.end[0] + 1) if ln not in doc)
    return len(lines)


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


if __name__ == "__main__":
    files = sys.argv[1:] or package_files()
    print(sum(code_lines(p) for p in files))
