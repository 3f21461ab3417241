"""The demo refuses bad arguments with one line, before building anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--layers", "0"], "argument --layers: 0 must be at least 1"),
        (["--hidden", "30"], "argument --hidden: 30 must be at least 16 and a multiple of 16"),
        (["--hidden", "8"], "argument --hidden: 8 must be at least 16 and a multiple of 16"),
        (["--layers", "two"], "argument --layers: 'two' is not a whole number"),
        (["--verl", "1.0"], "verl 1.0 is not set up here"),
        (["--te", "1.13.0"], "TE 1.13.0 does not run on the twin"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], expected: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "demo" / "demo.py"), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith(f"demo.py: error: {expected}"), proc.stderr
