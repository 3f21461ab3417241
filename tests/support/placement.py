"""The flush net's placement rule asked of plain layers, as the net asks it of its weak references:
`offloaded(layers)` runs `te/placement.offloaded_entries` (the one look at a probed parameter,
then the full reading) over entries that hold each layer strongly, each with no probe yet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from te_offload_shim.te import placement


class Held:
    """A layer held as the net's weak reference presents it: called, it gives the layer."""

    __slots__ = ("layer", "probe")
    probe: str | None

    def __init__(self, layer: Any) -> None:
        self.layer, self.probe = layer, None

    def __call__(self) -> Any:
        return self.layer


def offloaded(layers: Iterable[Any], is_device: str | None = None) -> list[Any]:
    """The layers of `layers` whose own weights (one at least) have all left the device, none managed
    by a sharding wrapper."""
    return placement.offloaded_entries([Held(layer) for layer in layers], is_device)


def left_device(layer: Any) -> bool:
    """Whether the net takes `layer` for offloaded."""
    return offloaded([layer]) == [layer]
