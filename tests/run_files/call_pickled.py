"""Loads a pickled function as a Ray worker loads a setup hook shipped by value, calls it and says it
returned (tests/activation/test_ray_runtime_env.py); with --report, then whether the shim is installed
and whether `status` would name the Ray setup hook as the route that brought it."""

import pickle
import sys

if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        hook = pickle.load(f)
    hook()
    print("returned")
    if "--report" in sys.argv[2:]:
        import te_offload_shim
        from te_offload_shim.activation import pth

        print("installed", te_offload_shim.installed())
        print("ray route", pth.routes()["ray_worker_setup_hook"])
