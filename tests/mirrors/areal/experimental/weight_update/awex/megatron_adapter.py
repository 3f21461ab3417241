"""Mirror of AReaL 1.0.4's awex training adapter.

Upstream: the PyPI release areal 1.0.4 (areal-1.0.4-py3-none-any.whl, same as tag v1.0.4 37d6c640),
areal/experimental/weight_update/awex/megatron_adapter.py. Re-writes only the lines that matter:
`class AwexMegatronAdapter` (l.43) with `release_memory(self, tags: list[str] | None = None)` (l.411,
same `tags or ["optimizer", "weights"]` default as the later colocate_writer), `_offload_model_weights`
(l.520) moving `self._engine.model.named_parameters()` with `param.data = ...` (no
`_ParamAndGradBuffer.offload_to_cpu`), and `torch.cuda.empty_cache()` at its end replaced by a recorder.
The real module imports `awex`, httpx and areal's service stack (aiohttp, flask, hydra-core dev builds...).
"""

from __future__ import annotations

import gc
from typing import Any

import mirror_flush


class AwexMegatronAdapter:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._offloaded_weights: dict[str, Any] = {}
        self._released_tags: set[str] = set()

    def release_memory(self, tags: list[str] | None = None) -> None:
        tags = tags or ["optimizer", "weights"]
        tags_to_release = [t for t in tags if t not in self._released_tags]
        if not tags_to_release:
            return
        if "optimizer" in tags_to_release:
            self._released_tags.add("optimizer")
        if "weights" in tags_to_release:
            self._offload_model_weights()
            self._released_tags.add("weights")
        gc.collect()
        mirror_flush.empty_cache(self._engine.model)  # upstream: torch.cuda.empty_cache()

    def _offload_model_weights(self) -> None:
        if self._engine.model is None:
            return
        for chunk in self._engine.model:  # upstream: _MegatronModelList.named_parameters()
            for name, param in chunk.named_parameters():
                self._offloaded_weights[name] = param.data.detach().to("cpu", copy=True)
