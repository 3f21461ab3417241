"""The demo end to end, at its smallest size: what a newcomer's first command prints.

On this CPU machine it builds its model from TE's own layers on the twin (demo/demo.py), so the
rows below are the caches TE's forward made: 1 layer, 4 TE linears. The third row is the flush net's:
verl's function loaded under another module name (a fork's copy no row watches)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO


def test_the_demo_shows_te_caches_cleared_by_the_shim_and_by_its_net_and_bit_identical_losses() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine the demo runs its stand-ins on the GPU (demo/demo.py), not TE's twin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TE_OFFLOAD_SHIM")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "demo" / "demo.py"), "--layers", "1", "--hidden", "16"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Transformer Engine 2.20.2's own modules" in out and "stand-ins" not in out, out
    found = re.findall(r"^(with(?:out)? the shim|a fork's copy \(net\)) +(\d+) +(\d+) ", out, re.M)
    rows = {m[0]: (int(m[1]), int(m[2])) for m in found}
    assert rows == {"without the shim": (4, 4), "with the shim": (4, 0), "a fork's copy (net)": (4, 0)}, out
    assert "In the 3 runs the losses are bit-identical (4 of 4)" in out, out
    # the net's one line names the copy's flush: verl's file, loaded as another module, in its offload function
    line = re.search(
        r"^  te_offload_shim: \[rank 0\] an offload the target table does not know left 4 FP8 weight caches .*$",
        out,
        re.M,
    )
    assert line is not None, out
    assert line[0].endswith("verl/utils/megatron_utils.py:545 in offload_megatron_model_to_cpu"), line[0]
