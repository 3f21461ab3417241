"""A traceback through a wrapped call shows no frame of the shim where tools allow hiding it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import BOOTSTRAP, REPO, child_env


def _pytest_with_the_shim(folder: Path, targets: str) -> subprocess.CompletedProcess[str]:
    """pytest over `folder` in an interpreter where the shim is active from start-up (the
    bootstrap of `te-offload-shim run`), with `targets` as TE_OFFLOAD_SHIM_TARGETS."""
    env = child_env({"TE_OFFLOAD_SHIM_TARGETS": targets}, path=[BOOTSTRAP, folder])
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly"]
    return subprocess.run([*args, "-q"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_tracebacks_through_a_wrapped_call_hide_the_shims_frame(tmp_path: Path) -> None:
    # pytest's own test_better_reporting_on_conftest_load_failure, with a target on the function
    # that imports the conftest: the report must be what it is without the shim.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "test_nothing.py").write_text("")
    conftest = broken / "conftest.py"
    conftest.write_text("def foo():\n    import qwerty\nfoo()\n")
    run = _pytest_with_the_shim(broken, "_pytest.pathlib:import_path@path")
    assert run.stdout.splitlines() == [], run.stdout
    assert run.stderr.splitlines() == [
        f"ImportError while loading conftest '{conftest}'.",
        "conftest.py:3: in <module>",
        "    foo()",
        "conftest.py:2: in foo",
        "    import qwerty",
        "E   ModuleNotFoundError: No module named 'qwerty'",
    ], run.stderr

    # An error out of a wrapped offload (an OOM in verl's offload) reports the offload's frames only.
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "raising_offload.py").write_text("def offload(models):\n    raise MemoryError('CUDA out of memory')\n")
    (failing / "test_offload.py").write_text(
        "import raising_offload\n\n\ndef test_offload():\n    raising_offload.offload([])\n"
    )
    run = _pytest_with_the_shim(failing, "raising_offload:offload")
    assert "MemoryError: CUDA out of memory" in run.stdout, run.stdout
    assert "raising_offload.py:2: MemoryError" in run.stdout, run.stdout
    assert "te_offload_shim" not in run.stdout + run.stderr, run.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import raising_offload, te_offload_shim as s; print(s.status()['targets'][-1])"],
        cwd=failing,
        env=child_env({"TE_OFFLOAD_SHIM_TARGETS": "raising_offload:offload"}, path=[BOOTSTRAP, failing]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "'state': 'patched'" in probe.stdout, (probe.stdout, probe.stderr)
    assert str(REPO) in child_env()["PYTHONPATH"]
