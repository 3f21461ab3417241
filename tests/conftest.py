"""Shared test plumbing: fresh interpreters with a chosen verl release on the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
UNFIXED_VERL = ("0.7.1", "0.8.0")
FIXED_VERL = ("0.9.1",)

PRELUDE = """
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)
"""


def verl_path(version: str) -> Path:
    path = DEPS / f"verl-{version}"
    if not (path / "verl").is_dir():
        pytest.skip(f"verl {version} not installed in {path} (run scripts/setup-env.sh)")
    return path


def run_py(
    code: str,
    *,
    verl: str | None = None,
    env: dict[str, str] | None = None,
    path: list[str | Path] = (),  # type: ignore[assignment]
    timeout: int = 180,
) -> dict:
    """Run `code` in a fresh interpreter; return the dict it passed to `emit(...)`, plus its stderr.

    `path` goes first on PYTHONPATH (modules a test wrote)."""
    paths = [str(p) for p in path]
    # CI re-runs the subprocess suites with wrapt 1.x first on the path (scripts/test.sh)
    paths += [p for p in os.environ.get("TEST_PYTHONPATH_PREFIX", "").split(os.pathsep) if p]
    paths.append(str(REPO))
    if verl is not None:
        paths.append(str(verl_path(verl)))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=REPO,
    )
    results = [line[len("RESULT ") :] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    out = json.loads(results[-1])
    out["_stderr"] = proc.stderr
    return out
