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
    offset = 0
    for history, scale in zip(amax_histories, scales, strict=True):
        _length, num_scales = history.shape
        for j in range(num_scales):
            reduced = buffer[offset + j] if buffer is not None else None
            last = reduced if reduced is not None and float(reduced) != 0.0 else history[0, j].clone()
            amax = torch.tensor(0.0, dtype=torch.float32)
            if float(last) != 0.0:
                column = history[:, j].clone()
                rolled = torch.cat([column[1:], last.reshape(1)])
                amax = rolled.max()
                rolled[0] = 0.0
                history[:, j].copy_(rolled)
            if amax_compute_algo == "most_recent":
                amax = last.float()
            value = scaled_max / amax if bool(torch.isfinite(amax)) and float(amax) > 0 else scale[j].float()
            if bool(torch.isinf(value)):
                value = torch.tensor(dtypes.FLOAT32_MAX, dtype=torch.float32)
            scale[j] = value
        offset += num_scales
