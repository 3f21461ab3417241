"""A fork's copy of a framework's module: the same file imported under another module name, so that
no row of the target table (which watches module names) recognises it. The demo's net case and the
net's proof on the twin (tests/twin/test_twin_net.py) load verl's `megatron_utils.py` this way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_as(path: Path, name: str) -> ModuleType:
    """`path` imported as module `name` (its own imports resolved as usual)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
