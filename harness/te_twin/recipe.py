"""Delayed scaling's amax-history and scale update.

Source: common/recipe/delayed_scaling.cu `kernel_bulk` (called by csrc/extensions/recipe.cpp
`fused_amax_and_scale_update_after_reduction`; TransformerEngine main and v2.9). Per amax history
(shape [length, num_scales]) and scale (shape [num_scales]), for each scale index:
- the newest amax is the reduction buffer's entry (the histories' rows 0, concatenated and
  all-reduced), or the history's own row 0 where that entry is 0;
- if that amax is not 0 the history is rolled: row i takes row i+1, the last row takes the newest
  amax, row 0 becomes 0 (it is where the next step's casts accumulate); if it is 0 nothing rolls;
- amax = the newest ("most_recent") or the max over the rolled history ("max"; 0 when not rolled);
- scale = (fp8_max * 2^-margin) / amax when amax is finite and > 0, else the old scale; an
  infinite scale becomes float32 max.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.te_twin import dtypes
from harness.te_twin.counters import kernel


@kernel("fused_amax_and_scale_update_after_reduction")
def fused_amax_and_scale_update_after_reduction(
    amax_reduction_buffer: torch.Tensor,
    amax_histories: list[torch.Tensor],
    scales: list[torch.Tensor],
    amax_compute_algo: str,
    fp8_dtype: Any,
    margin: float,
) -> None:
    if amax_compute_algo not in ("max", "most_recent"):
        raise RuntimeError(f"Unsupported amax compute algorithm ({amax_compute_algo})")
    scaled_max = torch.tensor(dtypes.FP8_MAX[dtypes.value(fp8_dtype)], dtype=torch.float32) * torch.pow(
        torch.tensor(2.0, dtype=torch.float32), -float(margin)
    )
    buffer = (
        None
        if amax_reduction_buffer is None or amax_reduction_buffer.numel() == 0
        else amax_reduction_buffer.reshape(-1)
    )
    # Every scale index of every history at once, the kernel's per-index rule as tensor ops (an
    # index-by-index loop of scalar tensors was most of a twin process's CPU); histories of one
    # length (the recipe's amax_history_len, TE's only case) are side by side in one [length, n] table.
    sizes = [history.shape[1] for history in amax_histories]
    if not sizes:
        return
    if len({history.shape[0] for history in amax_histories}) != 1:
        for k, (history, scale) in enumerate(zip(amax_histories, scales, strict=True)):
            start = sum(sizes[:k])
            reduced = None if buffer is None else buffer[start : start + sizes[k]]
            _update(history, scale, reduced, scaled_max, amax_compute_algo)
        return
    history = torch.cat(amax_histories, dim=1)
    scale = torch.cat([s if s.dim() == 1 else s.reshape(-1) for s in scales])
    _update(history, scale, None if buffer is None else buffer[: sum(sizes)], scaled_max, amax_compute_algo)
    torch._foreach_copy_(list(amax_histories), list(history.split(sizes, dim=1)))
    torch._foreach_copy_(list(scales), [p.reshape(t.shape) for p, t in zip(scale.split(sizes), scales, strict=True)])


def _update(
    history: torch.Tensor, scale: torch.Tensor, reduced: torch.Tensor | None, scaled_max: torch.Tensor, algo: str
) -> None:
    """kernel_bulk's rule for each column of `history` ([length, n]) and entry of `scale` ([n]), in place."""
    num_scales = history.shape[1]
    newest = history[0].clone()
    if reduced is not None:
        reduced = reduced.to(newest.dtype)
        newest = torch.where(reduced != 0.0, reduced, newest)  # NaN != 0: a NaN reduction is taken
    rolls = newest != 0.0
    rolled = torch.cat([history[1:], newest.reshape(1, num_scales)])
    amax = torch.where(rolls, rolled.max(dim=0).values, torch.zeros_like(newest))  # max propagates NaN
    rolled[0] = 0.0
    history.copy_(torch.where(rolls.reshape(1, num_scales), rolled, history))
    if algo == "most_recent":
        amax = newest.float()
    usable = torch.isfinite(amax) & (amax > 0)
    value = torch.where(usable, scaled_max / torch.where(usable, amax, torch.ones_like(amax)), scale.float())
    value = torch.where(torch.isinf(value), torch.tensor(dtypes.FLOAT32_MAX, dtype=torch.float32), value)
    scale.copy_(value)
