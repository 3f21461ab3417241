"""What `te-offload-shim enable` left in effect, printed as JSON by an interpreter of the venv that
tests/activation/test_cli_enable.py builds: is the shim loaded and installed at start, was wrapt loaded before
a target, and (with TE_OFFLOAD_SHIM_TARGETS set) is `faketarget.offload` patched once."""

import json
import os
import sys


def main() -> None:
    shim = sys.modules.get("te_offload_shim")
    out: dict[str, object] = {
        "loaded": shim is not None,
        "installed": bool(shim and shim.installed()),
        "wrapt_at_start": "wrapt" in sys.modules,
        "isolated": sys.flags.isolated,
    }
    if os.environ.get("TE_OFFLOAD_SHIM_TARGETS"):
        import faketarget  # type: ignore[import-not-found]  # written into the venv by the test

        out["wrapt_after_target"] = "wrapt" in sys.modules
        if shim is not None:
            from te_offload_shim.engine.patch import shim_layers

            out["layers"] = shim_layers(faketarget.offload)
            out["state"] = {r["name"]: r["state"] for r in shim.status()["targets"]}["faketarget:offload"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
