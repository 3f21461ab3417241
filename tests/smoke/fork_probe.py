"""The fresh interpreter of the smoke test of a fork during the first load: a worker thread's first
target import is loading the shim's engine (held just before `engine.handler`'s body, with
`engine.patch` half built, for one second) when the main thread forks. The fork waits for the load;
the child imports another target and the one that was loading, and offloads through both. Prints
one JSON line.

    TE_OFFLOAD_SHIM_TARGETS=smoke_target:offload,smoke_target_next:offload python tests/smoke/fork_probe.py
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
import threading
import time
import warnings
from typing import Any

HELD = "te_offload_shim.engine.handler"


class HoldImport:
    """Holds the import of `name` just before its body runs, its module lock taken."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entered, self.release = threading.Event(), threading.Event()

    def find_spec(self, fullname: str, path: Any = None, target: object = None) -> Any:
        if fullname != self.name or self.entered.is_set():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        assert spec is not None and spec.loader is not None
        real, hold = spec.loader, self

        class Holding:
            def create_module(self, spec: Any) -> Any:
                return real.create_module(spec)

            def exec_module(self, module: Any) -> None:
                module.__loader__ = module.__spec__.loader = real
                hold.entered.set()
                hold.release.wait(30)
                real.exec_module(module)

        spec.loader = Holding()  # type: ignore[assignment]
        return spec


def main() -> None:
    import te_offload_shim

    hold = HoldImport(HELD)
    sys.meta_path.insert(0, hold)
    worker = threading.Thread(target=importlib.import_module, args=("smoke_target",))
    worker.start()
    assert hold.entered.wait(30), "the worker's first target import is loading the engine"
    threading.Timer(1.0, hold.release.set).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads running
        pid = os.fork()
    waited = hold.release.is_set()  # the fork returned only once the load was let go
    if pid == 0:
        try:
            importlib.import_module("smoke_target_next").offload([])
            importlib.import_module("smoke_target").offload([])
            os._exit(0 if te_offload_shim.stats()["calls"] == 2 else 3)
        except BaseException:
            os._exit(4)
    status = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    hold.release.set()
    worker.join(30)
    report = {"python": list(sys.version_info[:2]), "child": "hung" if status is None else status, "waited": waited}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
