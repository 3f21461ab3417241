"""scripts/discover.py over real packages: verl 0.8.0 and 0.9.1, ms-swift 4.6.0, megatron-core; and
run as a script from the checkout, with nothing installed.

The scans over real packages each run in a fresh interpreter, so that "imports nothing" can be
checked on `sys.modules`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEPS, child_env
from support.discover_script import SCRIPT, def_line
from support.set_up import needs

SWIFT = (DEPS / "ms-swift-4.6.0").resolve()  # discover reports resolved paths (.deps may be a link)
VERL_08 = (DEPS / "verl-0.8.0").resolve()
VERL_09 = (DEPS / "verl-0.9.1").resolve()
MEGATRON = (DEPS / "megatron-core-0.16.0").resolve()
OFFLOAD = "offload_megatron_model_to_cpu"


@pytest.mark.subprocess(timeout=120)
def test_discover_finds_verl_and_ms_swift_and_imports_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from support.discover_script import main

    for folder in (VERL_08, VERL_09, SWIFT):
        needs(folder, f"{folder} not installed")
    before = set(sys.modules)
    assert main("--json", str(VERL_08), str(VERL_09), str(SWIFT)) == 0
    rows = json.loads(capsys.readouterr().out)
    imported = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not imported & {"verl", "swift", "torch", "megatron", "mcore_bridge", "triton"}, imported

    def row(folder: Path, module: str) -> dict:
        found = [r for r in rows if r["target"] == f"{module}:{OFFLOAD}" and r["file"].startswith(str(folder))]
        assert len(found) == 1, (folder, rows)
        return found[0]

    verl_file = VERL_08 / "verl" / "utils" / "megatron_utils.py"
    old = row(VERL_08, "verl.utils.megatron_utils")
    assert (old["file"], old["line"]) == (str(verl_file), def_line(verl_file, OFFLOAD))
    assert old["covered"] is True and old["covered_by"] == "verl"
    fixed = row(VERL_09, "verl.utils.megatron_utils")
    assert fixed["covered"] is True and fixed["covered_by"] == "clears _fp8_workspaces itself"
    swift_file = SWIFT / "swift" / "megatron" / "trainers" / "utils.py"
    swift = row(SWIFT, "swift.megatron.trainers.utils")
    assert (swift["file"], swift["line"]) == (str(swift_file), def_line(swift_file, OFFLOAD))
    assert swift["covered"] is True and swift["covered_by"] == "ms-swift" and swift["where"] == "models"
    # The measured precision over these three folders (docs/frameworks.md): nothing else is reported.
    assert [r["target"] for r in rows if not r["covered"]] == []


@pytest.mark.subprocess(timeout=120)
def test_text_output_and_the_value_to_paste(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from support.discover_script import main

    from te_offload_shim.integrations.user_targets import parse_user_targets

    megatron = MEGATRON
    needs(megatron / "megatron", f"{megatron} not installed")
    assert main(str(megatron)) == 0
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
    assert main("--json", str(megatron)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["target"] for r in rows if r["covered_by"] == "TE_OFFLOAD_SHIM_TARGETS"} == {t.path for t in targets}
    assert main("--all", str(megatron)) == 0
    out = capsys.readouterr().out
    assert "0 not covered" in out and "[covered: TE_OFFLOAD_SHIM_TARGETS]" in out


_VERL_OFFLOAD = """\
import torch
from megatron.core import parallel_state


def offload_megatron_model_to_cpu(models):
    for chunk in models:
        for buffer in chunk.buffers:
            buffer.offload_to_cpu()
    torch.cuda.empty_cache()
"""


def _run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -I -S scripts/discover.py ARGS...`: no PYTHONPATH and no site-packages, so no installed
    te_offload_shim (the test venv's editable install included): only the checkout's."""
    command = [sys.executable, "-I", "-S", str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=cwd, timeout=60)


def test_run_from_the_checkout_it_reads_the_checkouts_table_with_nothing_installed(tmp_path: Path) -> None:
    module = tmp_path / "tree" / "verl" / "utils" / "megatron_utils.py"
    module.parent.mkdir(parents=True)
    module.write_text(_VERL_OFFLOAD)
    proc = _run_script("--all", str(tmp_path / "tree"), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == [
        f"verl.utils.megatron_utils:{OFFLOAD}  {module.resolve()}:{def_line(module, OFFLOAD)}  moves weights "
        "(buffer.offload_to_cpu()) and flushes (empty_cache())  [covered: verl]",
        "scripts/discover.py: 0 not covered, 1 covered",
    ]


def test_a_missing_path_exits_2_and_says_what_it_read(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    proc = _run_script(str(tmp_path), "/no/such/path", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "scripts/discover.py: no such path: /no/such/path (1 files read)\n"
