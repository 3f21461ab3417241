"""A Ray job's driver for tests/integrations/test_ray.py, run by path as a fresh process (a real job is one).

`python ray_driver.py '{"shim": bool, "caller": str, "address": str, "runtime_env": {...}}'`: imports
the shim first when `shim`, starts one actor that imports `caller` and reports whether its alias is
wrapped, and prints `RESULT <json>`. The actor class lives in `__main__`, so Ray ships it by value."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ARGS = json.loads(sys.argv[1]) if __name__ == "__main__" else {}
if ARGS.get("shim"):
    import te_offload_shim  # noqa: F401  (before ray, as a user's training script would)

import ray  # noqa: E402  (after the shim, when there is one)


@ray.remote(num_cpus=0)
class Probe:
    def report(self) -> dict[str, Any]:
        import importlib

        before = "te_offload_shim" in sys.modules  # the hook ran before any task
        caller = importlib.import_module(ARGS["caller"])
        out: dict[str, Any] = {
            "before": before,
            "loaded": "te_offload_shim" in sys.modules,
            "layers": 0,
            "state": None,
            "hook_env": os.environ.get("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"),
            "pid": os.getpid(),
        }
        if out["loaded"]:
            import te_offload_shim
            from te_offload_shim import cli
            from te_offload_shim.engine.patch import shim_layers

            out["layers"] = shim_layers(caller.offload_megatron_model_to_cpu)
            out["state"] = {r["name"]: r["state"] for r in te_offload_shim.status()["targets"]}["verl"]
            out["status"] = cli.collect()
        return out


def main() -> None:
    ray.init(address=ARGS["address"], runtime_env=ARGS["runtime_env"], log_to_driver=False)
    assert ARGS["shim"] == ("te_offload_shim" in sys.modules), "the driver must not import the hook"
    # mypy does not apply class decorators: it does not see that @ray.remote made Probe an ActorClass
    report = ray.get(Probe.remote().report.remote(), timeout=240)  # type: ignore[attr-defined]
    ray.shutdown()
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
