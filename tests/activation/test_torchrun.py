"""torchrun (gloo, two local ranks) under `te-offload-shim run`: every rank has the shim, without
a line of its code importing it, and megatron-core's offload method is wrapped once in each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import REPO

CLI = Path(sys.executable).with_name("te-offload-shim")

RANK = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
shim_at_start = "te_offload_shim" in sys.modules  # before anything here imported it
from megatron.core.distributed import param_and_grad_buffer as pgb
import torch
import te_offload_shim
from te_offload_shim import health
from te_offload_shim.engine.patch import shim_layers
layers = shim_layers(vars(pgb._ParamAndGradBuffer)["offload_to_cpu"])
total = torch.tensor([layers])
dist.all_reduce(total)  # the ranks agree over gloo
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "shim_at_start": shim_at_start,
       "layers": layers, "total_layers": int(total.item()), "status": health.collect()}
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
dist.barrier()  # both ranks done before gloo is torn down (a loaded machine once aborted rank 0 here)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_ranks_under_run(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path))  # a user entry the bootstrap must keep
    cmd = [
        str(CLI), "run", "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(tmp_path / "rank.py"), str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-5000:]
    ranks = sorted(json.loads(p.read_text())["rank"] for p in out.glob("rank*.json"))
    assert ranks == [0, 1]
    for path in out.glob("rank*.json"):
        r = json.loads(path.read_text())
        assert r["world"] == 2 and r["shim_at_start"] is True, "the bootstrap activated the shim at start-up"
        assert r["layers"] == 1 and r["total_layers"] == 2
        s = r["status"]
        assert s["routes"]["sitecustomize_bootstrap"] is True and s["healthy"] is True
        mcore = {row["name"]: row for row in s["targets"]}["megatron-core"]
        assert mcore["present"] is True and mcore["would_be_patched"] is True
