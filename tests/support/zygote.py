"""A fork server for `@pytest.mark.subprocess`: a process that has imported torch, tensordict and
transformers once, and forks a child for each test.

Importing those three is about two thirds of the CPU of a fresh interpreter that imports verl
(about 8 of 13 s here), and most tests of this suite start one. None of them is the shim, wrapt, a
target module or anything a target's package holds (verl, megatron, ray, Transformer Engine, the
frameworks): `_check_clean` refuses to serve if one is loaded. So a forked child starts where a
fresh interpreter would for everything a test here checks: the order in which the shim and the
targets are imported, what the shim imports (it is not loaded), the patching itself.

A test that looks at what start-up itself imports (torch absent, a `sys.modules` difference across
`import te_offload_shim`) or that needs the interpreter started differently (`activate=True`)
runs in a really fresh interpreter instead: `@pytest.mark.subprocess(fresh=True)`.

Protocol, one JSON object a line: a request {"args", "env", "cwd", "pythonpath", "out"} on stdin;
the answer {"pid": ...} right after the fork, then {"rc": ...} when the child has exited.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

PRELOAD = ("torch", "tensordict", "transformers")
# Never loaded here: a child must import each of these itself, in the order its test decides.
FORBIDDEN = (
    "te_offload_shim", "wrapt", "verl", "megatron", "ray", "transformer_engine", "harness", "swift", "siirl", "trinity",
)  # fmt: skip


def _check_clean() -> list[str]:
    return sorted({name.split(".")[0] for name in sys.modules} & set(FORBIDDEN))


def _run_child(request: dict, base_path: list[str]) -> int:
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    # The path a fresh `python -m pytest` would have: the working directory, PYTHONPATH, then the
    # interpreter's own (standard library, site-packages and what their .pth files add).
    sys.path[:] = [request["cwd"], *request["pythonpath"], *base_path]
    importlib.invalidate_caches()
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    import pytest

    sys.argv = ["pytest", *request["args"]]
    return int(pytest.main(request["args"]))


def _exit_as_an_interpreter_does(rc: int) -> None:
    """What a fresh interpreter does at its end, then leave without running the zygote's own: the
    atexit callbacks the test registered (`ray.shutdown` stops the cluster a test started; left out,
    its processes would keep two cores busy for the rest of the suite), then flush."""
    import atexit

    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def main() -> None:
    base_path = [p for p in sys.path[1:]]  # less this script's folder, as `python -m` has none
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import pytest  # noqa: F401  (its import, too, is shared)

    loaded = _check_clean()
    if loaded:
        raise SystemExit(f"zygote: {', '.join(loaded)} loaded by the preload; refusing to serve")
    answer = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            rc = 70
            try:
                rc = _run_child(request, base_path)
            except BaseException:
                traceback.print_exc()
            finally:
                _exit_as_an_interpreter_does(rc)
        answer.write(json.dumps({"pid": pid}) + "\n")
        answer.flush()
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        answer.flush()


if __name__ == "__main__":
    main()
