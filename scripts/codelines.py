"""Code lines: lines holding a token that is no comment, no docstring and no blank.

    python3 scripts/codelines.py              # the package's total
    python3 scripts/codelines.py FILES...     # the total of those files
    python3 scripts/codelines.py --report [RUNTIME_JSON]   # what CI prints (scripts/test.sh)

What a training process loads is measured by tests/tools/test_code_budget.py on a real one (verl's
offload on TE's twin), which writes the modules it loaded with their code lines as JSON to the file
named by `TEST_RUNTIME_CODE_LINES`; `--report` prints that and the package's total, each against its
limit. The runtime's limit is a gate (the test fails over it); the package's a ceiling against bloat,
not a target: no named helper is inlined and no feature dropped to stay under either."""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_offload_shim"
RUNTIME_GATE = 2_500  # what a training process loads
PACKAGE_CEILING = 4_600  # the whole package
RUNTIME_REPORT = "TEST_RUNTIME_CODE_LINES"
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


def report(runtime_json: str | None) -> str:
    """The runtime's code lines (from the test's JSON, where it ran) and the package's, each against its
    limit."""
    text = Path(runtime_json).read_text(encoding="utf-8") if runtime_json else ""
    if text.strip():
        loaded: dict[str, int] = json.loads(text)
        runtime = (
            f"{sum(loaded.values()):,} code lines in {len(loaded)} modules, what a verl 0.8.0 training process"
            f" loads (gate: {RUNTIME_GATE:,})"
        )
    else:
        runtime = "not measured in this run (tests/tools/test_code_budget.py measures it)"
    files = package_files()
    package = f"{sum(code_lines(p) for p in files):,} code lines in {len(files)} files (ceiling: {PACKAGE_CEILING:,})"
    return f"runtime: {runtime}\npackage: {package}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        print(report(sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        print(sum(code_lines(p) for p in sys.argv[1:] or package_files()))
