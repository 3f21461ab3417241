"""What one clearing (or scan) of TE's caches found: the report types `clear_fp8_workspaces` and
`scan` return, and the error strict mode raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Skipped:
    """Caches the shim saw and deliberately left in place."""

    where: str
    reason: str
    entries: int = 0
    bytes: int = 0


@dataclass
class CacheReport:
    """What one clearing (or scan) found. `bytes` counts unique storages held by the entries only;
    storages the module's own parameters also hold are in `bytes_shared` (clearing frees none of
    them). `released_bytes` is measured with the CUDA allocator around the clearing, when CUDA is
    initialised; an entry still referenced elsewhere shows up as not released. None means unknown:
    CUDA is not initialised, or its counters could not be read (the caches are cleared all the same)."""

    cleared: bool = True
    entries: int = 0
    modules: int = 0
    bytes: int = 0
    bytes_shared: int = 0
    released_bytes: int | None = None
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # FP8 primary weights (`fp8_model_init` / megatron `fp8_param`): TE creates no workspace for
    # them, but the parameter itself carries a transpose / columnwise copy outside the DDP buffer
    # (Float8Tensor `_transpose`; MXFP8, blockwise, NVFP4 `_columnwise_*`), which an offload leaves
    # on the GPU. Reported; Float8Tensor transposes are also dropped (primary_weight_copies).
    primary_weight_params: int = 0
    primary_weight_bytes: int = 0  # left in place
    primary_weight_cleared: int = 0  # Float8Tensor transposes dropped through TE's own API (TE 2.4+)
    primary_weight_dropped_by: str | None = None  # that API: clear_columnwise_cache, remove_caches, update_usage
    primary_weight_where: list[str] = field(default_factory=list)
    # TE layers that hold nothing because caching is off by configuration (`caching_off`), by reason:
    # a 0 that is not a clearing's doing
    caching_off: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # `skipped` too, as plain dicts


class ShimError(RuntimeError):
    """Raised in strict mode for what would otherwise be a warning."""
