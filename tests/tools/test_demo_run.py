"""The demo end to end, at its smallest size: what a newcomer's first command prints.

On this CPU machine it builds its model from TE's own layers on the twin (demo/demo.py), so the
rows below are the caches TE's forward made: 1 layer, 4 TE linears."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO


def test_the_demo_shows_te_caches_cleared_by_the_shim_and_bit_identical_losses() -> None:
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
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^(with(?:out)? the shim) +(\d+) +(\d+) ", out, re.M)}
    assert rows == {"without the shim": (4, 4), "with the shim": (4, 0)}, out
    assert "the losses are bit-identical (4 of 4)" in out, out
