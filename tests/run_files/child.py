"""A child of `te-offload-shim run` (tests/activation/test_cli_run.py, copied next to the user's folders): reports,
then starts a multiprocessing "spawn" grandchild that reports too, and prints both as JSON."""

from __future__ import annotations

import builtins
import json
import multiprocessing as mp
import os
import sys
from typing import Any


def report() -> dict[str, Any]:
    shim = sys.modules.get("te_offload_shim")
    return {
        "loaded": shim is not None,
        "installed": bool(shim and shim.installed()),
        "user_sitecustomize": getattr(builtins, "USER_SITECUSTOMIZE", 0),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "pythonpath": os.environ.get("PYTHONPATH"),
        "sys_path": sys.path,
    }


def grandchild(queue: Any) -> None:
    queue.put(report())


if __name__ == "__main__":
    out = report()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=grandchild, args=(queue,))
    proc.start()
    out["spawned"] = queue.get(timeout=60)
    proc.join()
    print(json.dumps(out))
