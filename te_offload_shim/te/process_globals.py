"""TE's re-creatable process-global memory, given back at an offload when asked
(`TE_OFFLOAD_SHIM_TE_GLOBALS=1`; docs/residue.md has the decision, release by release).

Given back: `_dummy_wgrads` (module/base.py; in the wheels from 2.4, not 2.1), the weight-sized
placeholder gradients that TE's layers hand autograd when Megatron accumulates into `main_grad`
(`fuse_wgrad_accumulation`), one per (shape, dtype). TE re-creates a missing one on demand
(`get_dummy_wgrad`: `torch.empty`, then `fill_(0)` when the caller asks for zeros, which is all a
caller is promised) and hands out a `.detach()` view, never the dict's own tensor; verl's
`offload_megatron_optimizer` (0.7.1 - 0.9.1) clears the same dict. Popped, never resized: a tensor someone still holds
(a `param.grad` before Megatron's hook drops it) stays valid and is freed with its last holder.

Never given back where CUDA graphs may have captured it: a chunk of the call is graphed (the clearing
skipped it), a stream is capturing, or the process holds CUDA-graph private pools (any graph, of any
model: a global is not the chunk's).

Not given back: the cuBLAS workspaces. TE 2.20 allocates them up front, outside any CUDA-graph pool,
on purpose (module/linear.py `_prealloc_cublas_workspace`); TE 2.1 - 2.9 size the one workspace for
userbuffers in `initialize_ub`, which a lazily re-created one would not be. Reported, not freed.

`private_pools` (what the process holds in CUDA-graph private pools and MemPools) lives here, with its
two users: this module and the residue report (reports/residue.py); the handler imports this
module only where `TE_OFFLOAD_SHIM_TE_GLOBALS` is on, so a plain training run loads neither.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from te_offload_shim.te import sizes
from te_offload_shim.te.report import CacheReport

TE_BASE = "transformer_engine.pytorch.module.base"
DUMMY_WGRADS = "_dummy_wgrads"
GRAPHED = "CUDA graphs: "  # how the clearing names a chunk it left for its graphs (te/caches.py)


@dataclass(frozen=True)
class GivenBack:
    """What one offload's `give_back` did: `entries` tensors holding `bytes` given back, or none
    because a CUDA graph may hold them (`kept`: why). The engine adds these up (engine/stats.py)."""

    entries: int = 0
    bytes: int = 0
    kept: str | None = None


def private_pools(torch: Any) -> dict[str, int]:
    """Per CUDA device, the bytes reserved in segments of private pools: those of captured CUDA graphs
    (TE's `make_graphed_callables`, Megatron's, `torch.compile`'s) and of MemPools (TE's symmetric-memory
    pool among them), read from the allocator's snapshot (`torch.cuda.memory_snapshot()`: every
    segment whose `segment_pool_id` is not the default pool's `(0, 0)`). Which graph holds which pool
    cannot be read: the process keeps no registry of its graphs. Empty while CUDA is not initialised."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    try:  # without the frames memory-history recording adds to every block, where this torch takes it
        segments = cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = cuda.memory_snapshot()
    found: dict[str, int] = {}
    for segment in segments:
        if tuple(segment.get("segment_pool_id") or (0, 0)) != (0, 0):  # not the default pool
            device = f"cuda:{segment['device']}"
            found[device] = found.get(device, 0) + int(segment["total_size"])
    return found


def _why_kept(torch: Any, report: CacheReport) -> str | None:
    if any(s.reason.startswith(GRAPHED) for s in report.skipped):
        return "a chunk of this call is CUDA-graphed"
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        if cuda.is_current_stream_capturing():
            return "a CUDA graph is being captured"
        if private_pools(torch):
            return "the process holds CUDA-graph private pools"
    return None


def give_back(report: CacheReport) -> GivenBack | None:
    """After the clearing of one offload (`report`): pop TE's `_dummy_wgrads`, unless a CUDA graph may
    hold them; what it did, or None where TE holds none. Reads TE only from `sys.modules`; imports
    nothing."""
    base = sys.modules.get(TE_BASE)
    torch = sys.modules.get("torch")
    held = vars(base).get(DUMMY_WGRADS) if base is not None else None
    if torch is None or type(held) is not dict or not held:
        return None
    reason = _why_kept(torch, report)
    if reason is not None:
        return GivenBack(kept=reason)
    nbytes = sum(sizes.storages(list(held.values()), torch).values())
    entries = sum(held.pop(key, None) is not None for key in list(held))  # popped, never resized
    return GivenBack(entries, nbytes)
