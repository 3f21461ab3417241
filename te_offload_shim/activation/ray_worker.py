"""The setup hook every worker of a Ray job runs (`worker_process_setup_hook`) where the shim adds it.

Ray imports a hook given by name in every worker before its first task and kills the worker when
that fails, so the shim ships this one by value instead: integrations/ray_runtime_env.py compiles
this file's `setup_worker` into a module namespace of its own, which cloudpickle pickles by value.
It may therefore use no name of this module; what it needs, it imports inside. In the worker it
imports the package as a user would, and where it cannot, it says so in one line and the worker
goes on without the shim.
"""

from __future__ import annotations

hook_ran = False  # True in a worker where our hook ran: `te-offload-shim status` reports the route


def setup_worker() -> None:
    # Runs in a Ray worker, loaded by value: it may use no name of this module (it gets an empty
    # module namespace), so everything it needs is imported or written out here.
    import contextlib
    import os
    import sys

    if os.environ.get("TE_OFFLOAD_SHIM", "").strip().lower() in ("0", "false", "no", "off"):
        return
    try:
        import te_offload_shim
    except Exception as exc:
        # `[rank N]` as every line of the package has it, read as `_switches.rank()` reads it (the
        # package cannot be imported here): the first of its RANK_VARIABLES that holds a number
        values = (
            os.environ.get(name, "").strip() for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        )
        rank = next((f"[rank {int(value)}] " for value in values if value.isascii() and value.isdigit()), "")
        with contextlib.suppress(Exception):  # a closed or odd stderr: the worker goes on all the same
            sys.stderr.write(
                f"te_offload_shim: {rank}this Ray worker cannot import te_offload_shim ({type(exc).__name__}: "
                f"{exc}); it runs without the shim. Install te-offload-shim in this worker's Python environment "
                "to have it here.\n"
            )
        return
    # ray_setup never raises; an older copy of the package in this worker might lack it
    with contextlib.suppress(Exception):
        te_offload_shim.ray_setup()
        from te_offload_shim.activation import ray_worker

        ray_worker.hook_ran = True
