"""A CPU twin of Transformer Engine's compiled extension: TE's own Python, forward and backward,
on a CPU-only torch.

    from harness import te_twin
    te = te_twin.load("2.20.2")            # transformer_engine.pytorch of that release's wheel
    layer = te.Linear(64, 64, params_dtype=torch.float32)
    with te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()):
        y = layer(x, is_first_microbatch=True)   # TE's own forward; caches made by TE's code

Only two things are replaced, everything else is the release's own code from its PyPI wheel
(`.deps/te-X`, imported as harness/te_import.py does):
- the compiled extension `transformer_engine_torch` (harness/te_twin/extension.py): kernels in
  torch CPU math with the semantics of TE's C++ for that release (each module cites its source
  files); a kernel it lacks raises `MissingKernel` naming it;
- the device queries (device.py): one GPU of the chosen architecture, sm90 (Hopper) by default,
  sm100 (Blackwell) for MXFP8 and NVFP4; TE's "cuda" allocations land on the CPU (redirect.py).

One release per process: `load` changes torch process-wide. Run it in a fresh interpreter.
`counters.counting()` counts TE's kernel calls and device allocations (the step-cost benchmark);
under `host.offloading()` what an offload moves to the host answers as a host tensor (host.py).
"""

from __future__ import annotations

import os
import types
from typing import Any

from harness.te_twin import counters, host
from harness.te_twin.extension import MissingKernel

__all__ = ["MissingKernel", "autocast", "counters", "host", "load", "loaded", "model_init", "release"]

_loaded: tuple[str, int] | None = None


def load(release: str, *, sm: int = 90) -> types.ModuleType:
    """Import TE `release` (e.g. "2.20.2") on the twin, answering as an sm`sm` GPU; returns
    `transformer_engine.pytorch`. Once per process (a second call with the same arguments returns
    the loaded module)."""
    global _loaded
    import sys

    if _loaded is not None:
        if _loaded != (release, sm):
            raise RuntimeError(f"TE {_loaded[0]} (sm{_loaded[1]}) is already loaded on the twin in this process")
        return sys.modules["transformer_engine.pytorch"]
    # torch's compiler stack reads the real build's CUDA status at import (TE imports it anyway):
    # imported before the device answers change
    import torch._dynamo  # noqa: F401

    from harness import te_import, te_releases
    from harness.te_twin import device, extension, redirect

    # TE's own switch: no torch.compile of its fused helpers (TorchDynamo would target the GPU)
    os.environ.setdefault("NVTE_TORCH_COMPILE", "0")
    device.install(sm)
    redirect.install()
    module = te_import.load(release, extension=extension.build(te_releases.key(release), te_releases.folder(release)))
    if te_import.INIT_SKIPPED is not None:
        raise ImportError(f"TE {release} on the twin: {te_import.INIT_SKIPPED}")
    _loaded = (release, sm)
    return module


def loaded() -> tuple[str, int] | None:
    """(release, sm) loaded in this process, or None."""
    return _loaded


def release() -> tuple[int, ...]:
    """The loaded release as a tuple of ints."""
    if _loaded is None:
        raise RuntimeError("no TE release is loaded on the twin")
    return tuple(int(p) for p in _loaded[0].split(".")[:3])


def autocast(recipe: Any, enabled: bool = True) -> Any:
    """TE's FP8 autocast context of the loaded release with `recipe`: `te.autocast(recipe=...)`
    where the release has it (2.9+), else `te.fp8_autocast(fp8_recipe=...)`."""
    import sys

    te = sys.modules["transformer_engine.pytorch"]
    if hasattr(te, "autocast"):
        return te.autocast(enabled=enabled, recipe=recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=recipe)


def model_init(recipe: Any = None, enabled: bool = True) -> Any:
    """TE's context that makes modules keep FP8 primary weights: `quantized_model_init` where the
    release has it (2.9+), else `fp8_model_init`; the recipe is passed where the function takes one."""
    import inspect
    import sys

    te = sys.modules["transformer_engine.pytorch"]
    init = getattr(te, "quantized_model_init", None) or te.fp8_model_init
    kwargs: dict[str, Any] = {"enabled": enabled}
    if recipe is not None and "recipe" in inspect.signature(init).parameters:
        kwargs["recipe"] = recipe
    return init(**kwargs)
