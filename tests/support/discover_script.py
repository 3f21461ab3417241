"""scripts/discover.py, the contributors' source scanner, as the tests call it: loaded by its path
(the repository's `scripts` is no package, and verl's release folder on a child's path has a
`scripts` of its own) when this module is imported, its `main` run in the test's interpreter."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "discover.py"
_spec = importlib.util.spec_from_file_location("discover_script", SCRIPT)
assert _spec is not None and _spec.loader is not None
discover = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = discover  # where @dataclass looks its module up
_spec.loader.exec_module(discover)


def main(*args: str) -> int:
    """`python3 scripts/discover.py ARGS...`, in this interpreter: its exit status."""
    return int(discover.main(list(args)))


def def_line(file: Path, name: str, *, indented: bool = False) -> int:
    """The line of `def name(` in `file` (at any indentation with `indented`): an oracle
    independent of the scanner's ast walk."""
    pattern = (r"\s*" if indented else "") + rf"def {name}\("
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if re.match(pattern, line):
            return number
    raise AssertionError(f"no def {name} in {file}")
