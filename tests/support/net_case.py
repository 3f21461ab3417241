"""TE's own layers on the CPU twin, for the flush net's tests: built, cached by TE's own FP8
forward, and offloaded the ways the frameworks do it (imported inside a fresh interpreter)."""

from __future__ import annotations

from typing import Any

RELEASE = "2.20.2"
HIDDEN = 32
TOKENS = 16  # FP8 GEMMs need the leading dims divisible by 8, the last by 16


def load() -> Any:
    """TE's `transformer_engine.pytorch` on the twin (once per interpreter)."""
    from harness import te_twin

    return te_twin.load(RELEASE)


def cached_linear(te: Any, seed: int = 0) -> Any:
    """A `te.Linear` whose `_fp8_workspaces` TE's own forward (delayed scaling) has filled."""
    import torch

    torch.manual_seed(seed)
    layer = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.float32)
    forward(layer, is_first_microbatch=True)
    assert layer._fp8_workspaces, "TE's FP8 forward caches the quantized weight"
    return layer


def fp8_primary_linear(te: Any) -> Any:
    """A `te.Linear` built under `quantized_model_init` (FP8 primary weights), after TE's own FP8
    forward: no workspace entry; the weight's transpose is the cache."""
    import torch
    from transformer_engine.common.recipe import DelayedScaling

    from harness import te_twin

    with te_twin.model_init(DelayedScaling()):
        layer = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.float32)
    forward(layer, is_first_microbatch=True)
    assert type(layer.weight).__name__ == "Float8Tensor" and layer.weight._transpose is not None
    assert not layer._fp8_workspaces, "an FP8 primary weight has no workspace entry"
    return layer


def forward(layer: Any, *, is_first_microbatch: bool | None, seed: int = 1) -> Any:
    """One FP8 forward and backward (delayed scaling); returns the loss."""
    import torch
    from transformer_engine.common.recipe import DelayedScaling

    from harness import te_twin

    torch.manual_seed(seed)
    x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    with te_twin.autocast(DelayedScaling()):
        y = layer(x, is_first_microbatch=is_first_microbatch)
    loss = y.float().pow(2).mean()
    loss.backward()
    return loss.detach()


def offload_like_megatron(layer: Any) -> None:
    """What megatron-core's buffer `offload_to_cpu` and verl's `storage().resize_(0)` leave: every
    weight's storage resized to zero bytes (the tensors keep their shapes)."""
    for param in layer.parameters():
        param.data.untyped_storage().resize_(0)


def offload_off_the_device_type(layer: Any) -> None:
    """Every weight moved off the device type, as verl's `.to("cpu")` and AReaL's
    `param.data = torch.empty(0, device="cpu")` leave a chunk without DDP on a GPU. The twin's CPU is
    its device (and an empty tensor on the device is what a reshard leaves, which the net keeps), so
    here the layer goes to `meta`, off the twin's device type."""
    layer.to("meta")


def entries(layer: Any) -> int:
    return len(layer._fp8_workspaces)


def install_device() -> None:
    """The twin's device answers in place before TE is imported (as `load` does it: torch's compiler
    stack first, which reads the real build's CUDA status at its import)."""
    import torch._dynamo  # noqa: F401

    from harness.te_twin import device

    device.install()


def offloaded_under_a_recording_flush() -> tuple[Any, list[int]]:
    """The twin's device, `torch.cuda.empty_cache` replaced by a recorder (each call appends 1 to
    the list returned, and returns "flushed") before TE loads, and one cached TE Linear offloaded as
    megatron-core offloads: (that layer, the recorder's calls)."""
    import torch

    install_device()
    calls: list[int] = []
    torch.cuda.empty_cache = lambda: calls.append(1) or "flushed"  # type: ignore[assignment,func-returns-value]
    layer = cached_linear(load())
    offload_like_megatron(layer)
    return layer, calls


def use_targets() -> None:
    """Put tests/hostile/targets (`shim_targets`, for `TE_OFFLOAD_SHIM_TARGETS`) on the path."""
    import sys
    from pathlib import Path

    targets = str(Path(__file__).resolve().parents[1] / "hostile" / "targets")
    if targets not in sys.path:
        sys.path.insert(0, targets)
