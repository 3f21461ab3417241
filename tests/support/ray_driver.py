"""A Ray job's driver for tests/integrations/test_ray.py and tests/hostile/test_ray_workers.py, run as a fresh
process (a real job is one) by tests/support/ray_session.py's `drive()`.

`python ray_driver.py '{"shim": bool, "address": str, "runtime_env": {...}, ...}'`: imports the shim
first when `shim`, calls `ray.init` with that runtime_env, and prints `RESULT <json>`. With
`"caller": module`, one actor imports that module and reports whether its alias of verl's offload is
wrapped. With `"actors": [runtime_env or null, ...]`, one plain actor per entry (that entry as its own
`.options(runtime_env=...)`) answers 42 and says whether the shim is active in it: RESULT is
`{"reports": [...]}`, a report or `{"error": ...}` per actor. The actor classes live in `__main__`,
so Ray ships them by value."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ARGS = json.loads(sys.argv[1]) if __name__ == "__main__" else {}
if ARGS.get("shim"):
    import te_offload_shim  # noqa: F401  (before ray, as a user's training script would)

import ray  # noqa: E402  (after the shim, when there is one)


def _shim_state() -> dict[str, Any]:
    shim = sys.modules.get("te_offload_shim")
    return {
        "loaded": shim is not None,
        "installed": bool(shim is not None and shim.installed()),
        "hook_env": os.environ.get("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"),
        "pid": os.getpid(),
    }


@ray.remote(num_cpus=0)
class Probe:
    def report(self) -> dict[str, Any]:
        import importlib

        before = "te_offload_shim" in sys.modules  # the hook ran before any task
        caller = importlib.import_module(ARGS["caller"])
        out: dict[str, Any] = {"before": before, **_shim_state(), "layers": 0, "state": None}
        if out["loaded"]:
            import te_offload_shim
            from te_offload_shim import health
            from te_offload_shim.engine.patch import shim_layers

            out["layers"] = shim_layers(caller.offload_megatron_model_to_cpu)
            out["state"] = {r["name"]: r["state"] for r in te_offload_shim.status()["targets"]}["verl"]
            out["status"] = health.collect()
        return out


@ray.remote(num_cpus=0)
class Plain:
    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answer": 42, **_shim_state()}
        if out["loaded"]:
            from te_offload_shim.activation import pth

            out["ray_route"] = pth.routes()["ray_worker_setup_hook"]
        return out


def _plain(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    # mypy does not apply class decorators: it does not see that @ray.remote made Plain an ActorClass
    actor: Any = Plain.options(runtime_env=runtime_env) if runtime_env is not None else Plain  # type: ignore[attr-defined]
    try:
        answer: dict[str, Any] = ray.get(actor.remote().report.remote(), timeout=120)
        return answer
    except Exception as exc:  # an actor that died: the test says what it expected
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def main() -> None:
    ray.init(address=ARGS["address"], runtime_env=ARGS["runtime_env"], log_to_driver=False)
    assert ARGS["shim"] == ("te_offload_shim" in sys.modules), "the driver must not import the hook"
    if "actors" in ARGS:
        report: dict[str, Any] = {"reports": [_plain(env) for env in ARGS["actors"]]}
    else:
        # mypy does not apply class decorators: it does not see that @ray.remote made Probe an ActorClass
        probe: Any = Probe
        report = ray.get(probe.remote().report.remote(), timeout=240)
    ray.shutdown()
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
