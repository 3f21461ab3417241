"""Mirror of miles's Megatron training actor, with its own cache clearing.

Upstream: radixark/miles, miles/backends/megatron_utils/actor.py at 005270cb (the version carrying
PR #2142, "Drop TE cached quantized weights before offloading the training actor"; main 31f1ca96
has the same `sleep` without it). Re-writes only the lines that matter: `MegatronTrainRayActor.sleep`
calling `_clear_quantized_weight_workspaces()` first, gated on
`args.clear_quantized_weight_workspaces_on_offload` (argparse BooleanOptionalAction, default True),
`args.transformer_impl == "transformer_engine"` and `args.cuda_graph_impl == "none"`, then
`clear_memory(clear_host_memory=True)` and `torch_memory_saver.pause()` replaced by recorders.
`isinstance(module, TransformerEngineBaseModule)` becomes a look for `_fp8_workspaces` (no TE here).
Args without the flag stand for miles before the PR.
"""

from __future__ import annotations

from typing import Any

import mirror_flush


class MegatronTrainRayActor:
    def __init__(self, args: Any, models: list[Any]) -> None:
        self.args = args
        self.model = models
        self._asleep = False

    def _clear_quantized_weight_workspaces(self) -> None:
        if not (
            getattr(self.args, "clear_quantized_weight_workspaces_on_offload", False)
            and self.args.transformer_impl == "transformer_engine"
            and self.args.cuda_graph_impl == "none"
        ):
            return
        for model_chunk in self.model:
            for module in model_chunk.modules():
                if "_fp8_workspaces" in module.__dict__:
                    module._fp8_workspaces.clear()

    def sleep(self) -> None:
        assert self.args.offload_train
        if self._asleep:
            return
        self._clear_quantized_weight_workspaces()
        mirror_flush.empty_cache(self.model)  # upstream: clear_memory(clear_host_memory=True)
        mirror_flush.pause(self.model)  # upstream: torch_memory_saver.pause()
        self._asleep = True
