"""One of the processes that enable the shim at once (tests/activation/test_pth_writes.py): a container's
entrypoint, a Slurm prolog on a node sharing the venv.

`python enable_worker.py ROUNDS GO [--remove]`, run by an interpreter of the venv under test: prints
`{"pid": ...}`, waits until the file GO exists (so that all the processes start together), then runs
`te-offload-shim enable` ROUNDS times through the CLI's own entry point, first removing the `.pth`
each round with --remove (so that every round writes). Prints `{"pid", "failures"}`: the exit code
and the error line of every round that failed."""

import contextlib
import io
import json
import os
import sys
import time

if __name__ == "__main__":
    rounds, go = int(sys.argv[1]), sys.argv[2]
    remove = "--remove" in sys.argv[3:]
    from te_offload_shim.activation import pth
    from te_offload_shim.cli import main

    print(json.dumps({"pid": os.getpid()}), flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    path = os.path.join(pth.default_site(), pth.PTH_NAME)
    failures = []
    for _ in range(rounds):
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = main(["enable"])
        if code != 0:
            failures.append([code, said.getvalue().strip()])
    print(json.dumps({"pid": os.getpid(), "failures": failures}), flush=True)
