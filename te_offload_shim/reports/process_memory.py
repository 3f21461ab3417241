"""What a process holds on its devices outside any model: Transformer Engine's process-global
allocations (the CUDA-graph private pools are te/process_globals.py's). Read only: never initialises CUDA,
never creates a context on a device, never calls or clears anything of TE's. Torch is taken from
the caller, never imported. The allocator's and the driver's own numbers (allocated, reserved,
`mem_get_info`) are torch's to print: docs/residue.md says which call gives which.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from te_offload_shim.te import sizes
from te_offload_shim.te.process_globals import TE_BASE

_TE_GEMM = "transformer_engine.pytorch.cpp_extensions.gemm"
_TE_DISTRIBUTED = "transformer_engine.pytorch.distributed"


def on_device(device_type: str | None) -> Callable[[Any], bool]:
    """Whether a tensor is on the selected device type: None selects any device but the CPU."""
    if device_type is None:
        return lambda t: not t.is_cpu
    return lambda t: bool(t.device.type == device_type)


# --- TE's process-global memory -----------------------------------------------------------------


def te_global_memory(torch: Any, device_type: str | None = None) -> dict[str, int | None]:
    """TE's per-process allocations outside any module, where this process has TE loaded.

    * `_dummy_wgrads` (module/base.py, 2.4+): weight-sized zero gradients, one per shape and dtype,
      rebuilt lazily; verl frees them with the optimizer offload, the shim never does.
    * cuBLAS workspaces: module globals `_cublas_workspace` / `_multi_stream_cublas_workspace` in
      module/base.py up to 2.9; from 2.10 the results of `functools.lru_cache`d
      `cpp_extensions/gemm.py:get_cublas_workspace`, read (not called) through the cache's own
      dict. Small (32 MiB each on Hopper); a captured CUDA graph holds their addresses.
    * userbuffers (`_ub_communicators`): allocated by TE's C++ outside PyTorch's allocator, so their
      bytes are not visible here: reported as present (None), seen only in the driver's numbers.
    * `symmetric_mem_cache` (distributed.py, in the wheels from 2.4): the symmetric-memory buffers of
      TE's all-reduce, one per (numel, dtype, device, group, tag), never freed by TE.
    * `symm_mem_pool` (`_SYMM_MEM_POOL`, distributed.py 2.18+): the process-wide symmetric-memory
      `torch.cuda.MemPool`, freed only by TE's `release_symm_mem_pool()` (2.19+); its bytes are
      the segments its own `snapshot()` lists (None where that cannot be read)."""
    base, gemm, distributed = (sys.modules.get(name) for name in (TE_BASE, _TE_GEMM, _TE_DISTRIBUTED))
    selected = on_device(device_type)

    def size(values: Any) -> int:
        tensors: list[Any] = []
        sizes.inner_tensors(list(values), torch, tensors)
        return sum(sizes.storages([t for t in tensors if t is not None and selected(t)], torch).values())

    found: dict[str, int | None] = {}
    g = vars(base) if base is not None else {}
    wgrads = g.get("_dummy_wgrads")
    if isinstance(wgrads, dict):
        found["_dummy_wgrads"] = size(wgrads.values())
    workspaces = [g.get("_cublas_workspace"), *(g.get("_multi_stream_cublas_workspace") or ())]
    cached = _lru_cache_values(getattr(gemm, "get_cublas_workspace", None))
    if "_cublas_workspace" in g or cached is not None:
        found["cublas_workspaces"] = size([*workspaces, *(cached or ())])
    if g.get("_ub_communicators"):
        found["userbuffers"] = None
    d = vars(distributed) if distributed is not None else {}
    symmetric = d.get("symmetric_mem_cache")
    if isinstance(symmetric, dict):
        found["symmetric_mem_cache"] = size(symmetric.values())
    pool = d.get("_SYMM_MEM_POOL")
    if pool is not None:  # its segments, from its own `snapshot()` (read only); None where it cannot be read
        try:
            found["symm_mem_pool"] = sum(int(segment["total_size"]) for segment in pool.snapshot())
        except Exception:
            found["symm_mem_pool"] = None
    return found


def _lru_cache_values(function: Any) -> list[Any] | None:
    """The values a `functools.lru_cache(maxsize=None)` wrapper holds, without calling it (which
    could allocate). CPython's C wrapper keeps them in a dict it reports to the garbage collector."""
    if function is None or not hasattr(function, "cache_info"):
        return None
    import gc

    own = getattr(function, "__dict__", None)
    for referent in gc.get_referents(function):
        if type(referent) is dict and referent is not own:
            return list(referent.values())
    return None
