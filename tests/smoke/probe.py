"""The fresh interpreter of the smoke tests: imports `smoke_target` and prints one JSON line saying
whether the shim was already active, and whether `smoke_target.offload` is patched and still works.

    python tests/smoke/probe.py [--site DIR] [--shim first|after|no]

`--site DIR` processes DIR as a site directory (its .pth files run) first, as site.py does for
site-packages at interpreter start. `--shim` imports te_offload_shim before or after the target
module, or not at all (for the routes that activate it by themselves: .pth, `run`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import site
import sys


def main(argv: list[str] | None = None) -> None:
    shim_at_start = "te_offload_shim" in sys.modules  # `run` (sitecustomize) loads it before this line
    parser = argparse.ArgumentParser()
    parser.add_argument("--site")
    parser.add_argument("--shim", choices=("first", "after", "no"), default="no")
    args = parser.parse_args(argv)
    if args.site:
        site.addsitedir(args.site)
    if args.shim == "first":
        importlib.import_module("te_offload_shim")  # importing installs it
    before_target = "te_offload_shim" in sys.modules
    import smoke_target

    if args.shim == "after":
        importlib.import_module("te_offload_shim")
    # for the report; where nothing above loaded it, this installs it now: `shim_before_target` tells
    import te_offload_shim
    from te_offload_shim.engine.wrapper import shim_layers

    models = ["chunk"]
    rows = {row["target"]: row for row in te_offload_shim.status()["targets"]}
    result = smoke_target.offload(models, tag="kw")
    report = {
        "python": list(sys.version_info[:2]),
        "shim_at_start": shim_at_start,
        "shim_before_target": before_target,
        "shim_file": te_offload_shim.__file__,
        "layers": shim_layers(smoke_target.offload),
        "row": rows.get("smoke_target:offload"),
        "passed_through": result[0] is models and result[1] == "kw",
        "calls": te_offload_shim.stats()["calls"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
