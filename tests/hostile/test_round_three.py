"""Scenarios 8, 11 and 14, round three: what one clearing, one spec and one scan may touch.

- `discover` over a tree with one file it cannot parse (a 3,000-term sum) reports the others.
- Clearing leaves the cyclic collector exactly as the application has it.
- A `@where` spec calls only a final public method written in Python; a dunder or private step is
  refused at install, a built-in method found at the call is left alone, with the reason.
- A measurement that fails (the CUDA allocator's counters) never cancels the clear.
- A traceback through a wrapped call shows no frame of the shim where tools allow hiding it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BOOTSTRAP, REPO, child_env
from hostile_util import cached_layer, use_targets, write_module

_OFFLOAD = """\
import torch
from megatron.core import parallel_state


def offload_{name}(models):
    {body}
    for chunk in models:
        for buffer in chunk.buffers:
            buffer.offload_to_cpu()
    torch.cuda.empty_cache()
"""


@pytest.mark.subprocess()
def test_discover_skips_only_the_file_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from te_offload_shim import cli

    tree = tmp_path / "tree"
    tree.mkdir()
    sum_of = " + ".join
    # parses, but is deeper than a recursive walk of the syntax tree can go
    (tree / "deep_function.py").write_text(_OFFLOAD.format(name="deep", body="x = " + sum_of(["1"] * 600)))
    # does not even build: ast raises RecursionError
    (tree / "deep_module.py").write_text(_OFFLOAD.format(name="lost", body="pass") + "x = " + sum_of(["1"] * 3000))
    (tree / "plain.py").write_text(_OFFLOAD.format(name="plain", body="pass"))

    assert cli.main(["discover", str(tree)]) == 0
    out, err = capsys.readouterr()
    assert "deep_function:offload_deep" in out and "plain:offload_plain" in out, out
    assert "offload_lost" not in out and "deep_module" not in err, (out, err)
    assert (
        out.splitlines()[-1] == "TE_OFFLOAD_SHIM_TARGETS=deep_function:offload_deep@models,plain:offload_plain@models"
    ), out

    assert cli.main(["discover", "-v", str(tree)]) == 0
    out, err = capsys.readouterr()
    skipped = [line for line in err.splitlines() if "deep_module.py" in line]
    assert len(skipped) == 1 and "RecursionError" in skipped[0] and "skipped" in skipped[0], err


@pytest.mark.subprocess()
def test_clearing_leaves_the_collector_as_the_application_set_it() -> None:
    import gc
    import threading

    import te_offload_shim as shim

    class Workspaces(dict):
        """While the clearing reads the cache, another thread turns the collector off for good
        (Megatron's manual GC does this at the start of training)."""

        def values(self):  # type: ignore[no-untyped-def, override]
            other = threading.Thread(target=gc.disable)
            other.start()
            other.join()
            return super().values()

    layer = cached_layer()
    layer._fp8_workspaces = Workspaces(layer._fp8_workspaces)
    assert gc.isenabled()
    try:
        report = shim.clear_fp8_workspaces([layer])
        assert report.entries == 1 and not layer._fp8_workspaces
        assert not gc.isenabled(), "the application turned the collector off: it stays off"
    finally:
        gc.enable()


_CALLS = """\
class Holder:
    def __init__(self, chunks):
        self.model = chunks
        self._chunks = chunks

    def get_models(self):
        return self.model

    def offload_list(self):
        return len(self.model)

    def offload_dunder(self):
        return len(self.__dict__)

    def offload_private(self):
        return len(self._chunks)

    def offload_method(self):
        return len(self.model)
"""
_SPECS = (
    "where_calls:Holder.offload_list@self.model.clear()",  # list.clear: a built-in method
    "where_calls:Holder.offload_dunder@self.__dict__.clear()",  # a dunder step
    "where_calls:Holder.offload_private@self._chunks.copy()",  # a private step before a call
    "where_calls:Holder.offload_method@self.get_models()",  # a public method written in Python
)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ",".join(_SPECS)})
def test_a_where_spec_calls_only_a_public_method_written_in_python(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import te_offload_shim as shim

    problems = shim.status()["user_target_problems"]
    assert len(problems) == 2, problems
    assert "offload_dunder" in problems[0] and "__dict__" in problems[0], problems
    assert "offload_private" in problems[1] and "_chunks" in problems[1], problems
    warned = [r.getMessage() for r in caplog.records if "where_calls" in r.getMessage()]
    assert len(warned) == 2, warned

    write_module(tmp_path, "where_calls", _CALLS)
    import where_calls  # type: ignore[import-not-found]

    layer = cached_layer()
    holder = where_calls.Holder([layer])
    assert holder.offload_list() == 1, "list.clear was not called: the offload sees its models"
    assert layer._fp8_workspaces, "nothing was cleared for that call"
    assert holder.offload_dunder() == 2 and holder.offload_private() == 1
    left = shim.stats()["left_alone"]["where_calls:Holder.offload_list"]
    assert list(left.values()) == [1] and "built-in" in next(iter(left)), left
    assert holder.offload_method() == 1 and layer._fp8_workspaces == {}


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"})
def test_a_measurement_that_fails_never_cancels_the_clear() -> None:
    import torch

    import te_offload_shim as shim

    def half_initialised(device: object = None) -> int:
        raise RuntimeError("CUDA driver initialisation failed")

    torch.cuda.is_initialized = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_allocated = half_initialised  # type: ignore[assignment]
    layer = cached_layer()
    report = shim.clear_fp8_workspaces([layer])
    assert report.entries == 1 and layer._fp8_workspaces == {}
    assert report.released_bytes is None, "unknown, not a number"
    assert report.bytes > 0, "the byte accounting needs no allocator"

    use_targets()
    import shim_targets  # type: ignore[import-not-found]

    layer = cached_layer()
    assert shim_targets.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}, "the wrapped offload cleared"
    stats = shim.stats()
    assert (stats["entries"], stats["errors"]) == (1, 0), stats


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
