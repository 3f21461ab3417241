"""scripts/discover.py: one file it cannot read costs only itself, and it never waits.

- A tree with one file it cannot parse (a 3,000-term sum) reports the others.
- Without PATH it reads the folders on sys.path, not the distributions' file lists: one with a
  malformed RECORD (an empty line, written by hand or by a broken installer) is read like any other.
- A named pipe called x.py in the tree is no file to read: it is skipped, with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


_MEGATRON_OFFLOAD = """\
import megatron


def offload_megatron_model_to_cpu(models):
    for buffer in models.buffers:
        buffer.offload_to_cpu()
    torch.cuda.empty_cache()
"""


def _distribution(site: Path, name: str, record: str) -> None:
    """A distribution `name` installed in `site`: one module, `name`.py, and its RECORD."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text(record)
    (site / f"{name}.py").write_text(_MEGATRON_OFFLOAD)


@pytest.mark.subprocess()
def test_discover_skips_only_the_file_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from support.discover_script import main

    tree = tmp_path / "tree"
    tree.mkdir()
    sum_of = " + ".join
    # parses, but is deeper than a recursive walk of the syntax tree can go
    (tree / "deep_function.py").write_text(_OFFLOAD.format(name="deep", body="x = " + sum_of(["1"] * 600)))
    # does not even build: ast raises RecursionError
    (tree / "deep_module.py").write_text(_OFFLOAD.format(name="lost", body="pass") + "x = " + sum_of(["1"] * 3000))
    (tree / "plain.py").write_text(_OFFLOAD.format(name="plain", body="pass"))

    assert main(str(tree)) == 0
    out, err = capsys.readouterr()
    assert "deep_function:offload_deep" in out and "plain:offload_plain" in out, out
    assert "offload_lost" not in out and "deep_module" not in err, (out, err)
    assert (
        out.splitlines()[-1] == "TE_OFFLOAD_SHIM_TARGETS=deep_function:offload_deep@models,plain:offload_plain@models"
    ), out

    assert main("-v", str(tree)) == 0
    out, err = capsys.readouterr()
    skipped = [line for line in err.splitlines() if "deep_module.py" in line]
    assert len(skipped) == 1 and "RecursionError" in skipped[0] and "skipped" in skipped[0], err


@pytest.mark.subprocess()
def test_discover_reads_the_path_whatever_a_distributions_record_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from support.discover_script import main

    site = tmp_path / "site"
    _distribution(site, "broken_record", "broken_record.py,,\n\n,,\n")  # an empty line: importlib raises TypeError
    _distribution(site, "good_record", "good_record.py,,\n")
    here = tmp_path / "here"  # the current directory, first on sys.path under `python -m`: not read
    here.mkdir()
    (here / "local_offload.py").write_text(_MEGATRON_OFFLOAD)
    os.chdir(here)
    saved = list(sys.path)
    sys.path[:] = [str(here), str(site)]  # the only folders this interpreter sees now
    try:
        assert main("-v") == 0
    finally:
        sys.path[:] = saved
    out, err = capsys.readouterr()
    for name in ("good_record", "broken_record"):
        assert f"{name}:offload_megatron_model_to_cpu" in out, out
    assert "local_offload" not in out, out
    assert err == "", "nothing skipped: no RECORD is read"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.subprocess(timeout=60)
def test_discover_does_not_wait_on_a_named_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A named pipe called x.py in the tree (a tool's socket, a test fixture) blocked the read for good."""
    from support.discover_script import main

    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "pipe.py")
    (tree / "plain.py").write_text(_MEGATRON_OFFLOAD)
    assert main("-v", str(tree)) == 0
    out, err = capsys.readouterr()
    assert "plain:offload_megatron_model_to_cpu" in out, out
    assert "pipe.py: OSError: not a regular file" in err, err
