"""Mirror of ROLL's Megatron strategies.

Upstream: alibaba/ROLL, roll/distributed/strategy/megatron_strategy.py at 8eb27cc2 (path and
signatures unchanged v0.1.0 9eb672cf - v0.3.0 7f9d4d38). Re-writes only the lines that matter:
`MegatronInferStrategy.offload_states(self, include=None, non_blocking=False)` (l.667) and
`MegatronTrainStrategy(MegatronInferStrategy).offload_states(self, include=None, non_blocking=False,
pin_memory=True)` (l.1392), the model access `self.model.get_models()` (mcore_adapter `VirtualModels`,
model_factory.py l.124), the `OffloadStateType.model_params in include` tests, and
`current_platform.empty_cache()` at their end replaced by a recorder. ROLL moves weights itself
(`offload_megatron_no_grad_module`, the patched optimizer's `offload_states`), never through
`_ParamAndGradBuffer.offload_to_cpu`: the mirror moves them with a plain CPU copy.
"""

from __future__ import annotations

from typing import Any

import mirror_flush
import torch

from roll.utils.offload_states import OffloadStateType


class VirtualModels:
    """mcore_adapter.models.model_factory.VirtualModels: `get_models()` returns the chunk list."""

    def __init__(self, models: list[Any]) -> None:
        self.models = models

    def get_models(self) -> list[Any]:
        return self.models


def offload_megatron_no_grad_module(model_chunks: list[Any], pin_memory: bool = True) -> None:
    for chunk in model_chunks:
        for param in chunk.parameters():
            param.data = param.data.to("cpu", copy=True)


class _Optimizer:
    """The patched MegatronOptimizer.offload_states: `include=None` means every state."""

    def __init__(self, models: VirtualModels) -> None:
        self.models = models
        self.offloaded: list[Any] = []

    def offload_states(self, include: Any = None, non_blocking: bool = False, pin_memory: bool = True) -> None:
        self.offloaded.append(include)
        if include is None or "model_params" in [getattr(i, "value", i) for i in include]:
            offload_megatron_no_grad_module(self.models.get_models())


class MegatronInferStrategy:
    def __init__(self, models: list[Any]) -> None:
        self.model = VirtualModels(models)

    def offload_states(self, include: Any = None, non_blocking: bool = False) -> None:
        if include is None or OffloadStateType.model_params in include:
            offload_megatron_no_grad_module(model_chunks=self.model.get_models())
        mirror_flush.empty_cache(self.model.get_models())  # upstream: current_platform.empty_cache()


class MegatronTrainStrategy(MegatronInferStrategy):
    def __init__(self, models: list[Any]) -> None:
        super().__init__(models)
        self.optimizer = _Optimizer(self.model)

    def offload_states(self, include: Any = None, non_blocking: bool = False, pin_memory: bool = True) -> None:
        if include is not None:
            include_states = []
            if OffloadStateType.model_params in include:
                offload_megatron_no_grad_module(model_chunks=self.model.get_models(), pin_memory=pin_memory)
                include_states.append(OffloadStateType.model_params)
            if OffloadStateType.other_params in include:
                include_states.append(OffloadStateType.other_params)
            if OffloadStateType.optimizer_states in include:
                include_states.append(OffloadStateType.optimizer_states)
            include = include_states
        with torch.no_grad():
            self.optimizer.offload_states(include=include, non_blocking=non_blocking, pin_memory=pin_memory)
        mirror_flush.empty_cache(self.model.get_models())  # upstream: current_platform.empty_cache()
