"""The fresh interpreter of the lazy-loader smoke test: loads `smoke_target` through
`importlib.util.LazyLoader`, as scientific Python's `lazy_loader` does, with the shim installed
first, and prints one JSON line: the target's status row before its first use, and after it.

    python tests/smoke/lazy_probe.py --spec file|find

`--spec file` takes the module's spec from `spec_from_file_location` (no finder asked), `find` from
`importlib.util.find_spec` (the import system's finders, ours in front). Neither imports `threading`
first: on Python 3.12+ `LazyLoader.exec_module` imports it after the module is in sys.modules and
before the module is made lazy, so an import hook sees the module there with its body not run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import te_offload_shim


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", choices=("file", "find"), required=True)
    args = parser.parse_args(argv)
    threading_before = "threading" in sys.modules
    name = "smoke_target"
    if args.spec == "file":
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    else:
        spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)

    def row() -> Any:
        return next(r for r in te_offload_shim.status()["targets"] if r["target"] == "smoke_target:offload")

    before = row()
    models = ["chunk"]
    result = module.offload(models, tag="kw")  # the first use: the body runs now
    importlib.import_module("colorsys")  # the process's next import, where what is due fires

    from te_offload_shim.engine.wrapper import shim_layers

    after = row()
    second = module.offload(models, tag="kw")
    print(
        json.dumps(
            {
                "python": list(sys.version_info[:2]),
                "threading_before": threading_before,
                "before": before,
                "after": after,
                "layers": shim_layers(module.offload),
                "passed_through": result[0] is models and second[1] == "kw",
                "calls": te_offload_shim.stats()["calls"],
            }
        )
    )


if __name__ == "__main__":
    main()
