"""Mirror of ROLL's offload state names.

Upstream: alibaba/ROLL, roll/utils/offload_states.py at 8eb27cc2 (l.25; unchanged v0.1.0 - v0.3.0).
Re-writes only the enum the strategy tests against: `OffloadStateType(str, Enum)`.
"""

from __future__ import annotations

from enum import Enum


class OffloadStateType(str, Enum):
    model_params = "model_params"
    optimizer_states = "optimizer_states"
    other_params = "other_params"
