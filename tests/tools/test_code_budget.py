"""Code lines (scripts/codelines.py: comments and docstrings not counted): what a training process
loads, measured on a real one, is gated; the whole package has a ceiling against bloat. Neither is a
target. The runtime's measurement is written where `TEST_RUNTIME_CODE_LINES` says, for CI to print."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from support.verl_case import ENGINE

# scripts/codelines.py by its path: verl's release folder on a child's path has a `scripts` of its own
_spec = importlib.util.spec_from_file_location(
    "codelines", Path(__file__).resolve().parents[2] / "scripts/codelines.py"
)
assert _spec is not None and _spec.loader is not None
codelines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(codelines)
RUNTIME_GATE, PACKAGE_CEILING, code_lines = codelines.RUNTIME_GATE, codelines.PACKAGE_CEILING, codelines.code_lines
# What a person runs, never a training process (pyproject.toml's contract "the runtime imports none
# of the tools" keeps the runtime's imports away from them)
TOOLS = (
    "te_offload_shim.__main__",
    "te_offload_shim.cli",
    "te_offload_shim.health",
    "te_offload_shim.activation.pth",
    "te_offload_shim.integrations.versions",
)
# Runtime, loaded only when asked for (`residue()`, TE_OFFLOAD_SHIM_AUDIT; TE_OFFLOAD_SHIM_TE_GLOBALS;
# TE_OFFLOAD_SHIM_STATS; a user's call of the API)
# or by a target verl 0.8.0 never calls (megatron-core's buffer offload): not by a plain training run
ON_REQUEST = (
    "te_offload_shim.api",
    "te_offload_shim.integrations.megatron_ddp",
    "te_offload_shim.engine.stats_file",
    "te_offload_shim.reports.residue",
    "te_offload_shim.reports.process_memory",
    "te_offload_shim.reports.audit",
    "te_offload_shim.te.process_globals",
)


def loaded_package_files() -> dict[str, int]:
    """The package's modules this interpreter loaded, with their code lines."""
    return {
        name: code_lines(module.__file__)
        for name, module in sorted(sys.modules.items())
        if (name == "te_offload_shim" or name.startswith("te_offload_shim.")) and getattr(module, "__file__", None)
    }


def _a_training_process() -> dict[str, int]:
    """The shim imported first, then verl 0.8.0's engine and TE 2.20.2 (on the twin) with a Megatron
    GPT in DDP: one FP8 training step and verl's real offload, cleared by the shim. The package's
    modules it loaded, with their code lines."""
    import te_offload_shim
    from harness import gpt_on_twin as gpt

    gpt.load("2.20.2")
    caller = importlib.import_module(ENGINE)
    ddp = gpt.build("hybrid", layers=1, recipe="delayed", bf16=False)
    gpt.train_step(ddp, 0)
    caller.offload_megatron_model_to_cpu([ddp])
    loaded = loaded_package_files()  # before stats(), which loads the API a person asks for
    assert te_offload_shim.stats()["entries"] == 4, "the offload was cleared"
    print(
        f"{len(loaded)} modules, {sum(loaded.values())} code lines:",
        *(f"{n}: {c}" for n, c in loaded.items()),
        sep="\n  ",
    )
    return loaded


@pytest.mark.subprocess(verl="0.8.0", timeout=300)
def test_a_training_process_loads_no_tool() -> None:
    loaded = _a_training_process()
    assert not set(TOOLS) & loaded.keys(), "a training process loads no tool"
    assert not set(ON_REQUEST) & loaded.keys(), "nor a report it did not ask for"


@pytest.mark.subprocess(verl="0.8.0", timeout=300)
def test_what_a_training_process_loads_is_within_its_gate() -> None:
    loaded = _a_training_process()
    if os.environ.get(codelines.RUNTIME_REPORT):  # scripts/test.sh prints it after the suite
        Path(os.environ[codelines.RUNTIME_REPORT]).write_text(json.dumps(loaded), encoding="utf-8")
    total = sum(loaded.values())
    assert total <= RUNTIME_GATE, f"the runtime is {total} code lines, over its gate of {RUNTIME_GATE}"


def test_the_package_is_under_its_ceiling() -> None:
    total = sum(code_lines(p) for p in codelines.package_files())
    assert total <= PACKAGE_CEILING, f"the package is {total} code lines, over its ceiling of {PACKAGE_CEILING}"


def test_the_report_ci_prints_says_both_counts_and_their_limits(tmp_path: Path) -> None:
    measured = tmp_path / "runtime.json"
    measured.write_text(json.dumps({"te_offload_shim": 40, "te_offload_shim.engine.net": 2}), encoding="utf-8")
    package = sum(code_lines(p) for p in codelines.package_files())
    assert codelines.report(str(measured)).splitlines() == [
        "runtime: 42 code lines in 2 modules, what a verl 0.8.0 training process loads (gate: 2,500)",
        f"package: {package:,} code lines in {len(codelines.package_files())} files (ceiling: 4,600)",
    ]
    measured.write_text("", encoding="utf-8")  # the suite ran without the runtime's test
    assert codelines.report(str(measured)).startswith("runtime: not measured in this run")
