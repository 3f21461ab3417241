"""Clearing leaves the cyclic collector alone (guarantee 29), so what it allocates must not set it off.

Every object the collector tracks that the clearing keeps until the call ends (a tuple per TE layer,
say) counts toward the next collection; on a dense model (a TE layer per module, one entry of four
inner tensors each) one such object per layer triggers hundreds of collections per call, some over
the whole heap: the clearing ran twice as slowly with the collector on as with it off for the call.
"""

from __future__ import annotations

import pytest

LAYERS = 10_000  # a tuple per layer kept to the end of the call: 14 collections of the youngest generation


def _dense_model() -> tuple[object, list[tuple[dict, dict]]]:
    import torch

    from harness import te_standins as te

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2, 2))
            self.__dict__["_fp8_workspaces"] = {"weight": te.Float8BlockwiseQTensorV2(self.weight)}

    root = torch.nn.ModuleList(Plain() for _ in range(LAYERS))
    workspaces = [m.__dict__["_fp8_workspaces"] for m in root]
    return root, [(held, dict(held)) for held in workspaces]


@pytest.mark.subprocess()
def test_clearing_a_dense_model_sets_off_no_collection() -> None:
    import gc

    import te_offload_shim as shim

    root, refills = _dense_model()
    shim.clear_fp8_workspaces([root])  # the first call: torch makes the storages' Python objects once
    collections = [0, 0, 0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    for _ in range(3):
        for workspaces, entries in refills:
            workspaces.update(entries)
        gc.collect()
        gc.callbacks.append(count)
        try:
            report = shim.clear_fp8_workspaces([root])
        finally:
            gc.callbacks.remove(count)
        assert report.entries == LAYERS and report.bytes > 0, report
    assert gc.isenabled(), "the collector stays on"
    assert collections == [0, 0, 0], f"collections set off by 3 clearings, by generation: {collections}"
