"""A target module that activates the shim itself, halfway through its own import."""

from __future__ import annotations

from typing import Any

import te_offload_shim  # noqa: F401  (the point of this module)


def offload(models: Any) -> str:
    return "offloaded"
