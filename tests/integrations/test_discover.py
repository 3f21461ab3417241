"""`te-offload-shim discover` over real packages: verl 0.8.0 and 0.9.1, ms-swift 4.6.0, megatron-core.

Each test runs in a fresh interpreter, so that "imports nothing" can be checked on `sys.modules`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import DEPS
from support.set_up import needs

SWIFT = (DEPS / "ms-swift-4.6.0").resolve()  # discover reports resolved paths (.deps may be a link)
VERL_08 = (DEPS / "verl-0.8.0").resolve()
VERL_09 = (DEPS / "verl-0.9.1").resolve()
MEGATRON = (DEPS / "megatron-core-0.16.0").resolve()
OFFLOAD = "offload_megatron_model_to_cpu"


def _def_line(file: Path, name: str) -> int:
    """The line of `def name(` in `file`: an oracle independent of the scanner's ast walk."""
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if re.match(rf"def {name}\(", line):
            return number
    raise AssertionError(f"no def {name} in {file}")


@pytest.mark.subprocess(timeout=120)
def test_discover_finds_verl_and_ms_swift_and_imports_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from te_offload_shim import cli

    for folder in (VERL_08, VERL_09, SWIFT):
        needs(folder, f"{folder} not installed")
    before = set(sys.modules)
    assert cli.main(["discover", "--json", str(VERL_08), str(VERL_09), str(SWIFT)]) == 0
    rows = json.loads(capsys.readouterr().out)
    imported = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not imported & {"verl", "swift", "torch", "megatron", "mcore_bridge", "triton"}, imported

    def row(folder: Path, module: str) -> dict:
        found = [r for r in rows if r["target"] == f"{module}:{OFFLOAD}" and r["file"].startswith(str(folder))]
        assert len(found) == 1, (folder, rows)
        return found[0]

    verl_file = VERL_08 / "verl" / "utils" / "megatron_utils.py"
    old = row(VERL_08, "verl.utils.megatron_utils")
    assert (old["file"], old["line"]) == (str(verl_file), _def_line(verl_file, OFFLOAD))
    assert old["covered"] is True and old["covered_by"] == "verl"
    fixed = row(VERL_09, "verl.utils.megatron_utils")
    assert fixed["covered"] is True and fixed["covered_by"] == "clears _fp8_workspaces itself"
    swift_file = SWIFT / "swift" / "megatron" / "trainers" / "utils.py"
    swift = row(SWIFT, "swift.megatron.trainers.utils")
    assert (swift["file"], swift["line"]) == (str(swift_file), _def_line(swift_file, OFFLOAD))
    assert swift["covered"] is True and swift["covered_by"] == "ms-swift" and swift["where"] == "models"
    # The measured precision over these three folders (docs/frameworks.md): nothing else is reported.
    assert [r["target"] for r in rows if not r["covered"]] == []


@pytest.mark.subprocess(timeout=120)
def test_text_output_and_the_value_to_paste(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from te_offload_shim import cli
    from te_offload_shim.integrations.user_targets import parse_user_targets

    megatron = MEGATRON
    needs(megatron / "megatron", f"{megatron} not installed")
    assert cli.main(["discover", str(megatron)]) == 0
    lines = capsys.readouterr().out.splitlines()
    paste = lines[-1]
    assert paste.startswith("TE_OFFLOAD_SHIM_TARGETS=")
    value = paste.partition("=")[2]
    candidates = [line for line in lines if re.fullmatch(r"megatron\.\S+:\S+  /\S+\.py:\d+  moves weights .+", line)]
    assert candidates and len({line.split()[0] for line in candidates}) == len(value.split(",")), lines
    assert all("[covered" not in line for line in candidates), "covered candidates only with --all"
    targets, problems = parse_user_targets(value)
    assert problems == [] and {t.path for t in targets} == {line.split()[0] for line in candidates}

    # pasted, they count as covered: the text output lists none, --json says by what
    monkeypatch.setenv("TE_OFFLOAD_SHIM_TARGETS", value)
    assert cli.main(["discover", "--json", str(megatron)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["target"] for r in rows if r["covered_by"] == "TE_OFFLOAD_SHIM_TARGETS"} == {t.path for t in targets}
    assert cli.main(["discover", "--all", str(megatron)]) == 0
    out = capsys.readouterr().out
    assert "0 not covered" in out and "[covered: TE_OFFLOAD_SHIM_TARGETS]" in out
