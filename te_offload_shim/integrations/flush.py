"""The flush net's data: what it wraps (the allocator flush every offload ends with) and where TE's
layers come from (TE's base module class), and the watch table's callback that arms it when TE's
PyTorch modules are imported. The patching itself is the engine's (engine/net.py).
"""

from __future__ import annotations

from types import ModuleType

from te_offload_shim.engine import net, registry

# TE's base class of every layer with weights (transformer_engine/pytorch/module/base.py, 1.x - 2.20):
# the start-up watches this module, so the net arms right after its body runs, before any layer exists.
TE_BASE_MODULE = "transformer_engine.pytorch.module.base"
TE_BASE_CLASS = "TransformerEngineBaseModule"
TE_PACKAGE = "transformer_engine.pytorch"
# The allocator flush, where torch defines it and where torch.cuda re-exports it (`from .memory import *`).
FLUSHES = (("torch.cuda", "empty_cache"), ("torch.cuda.memory", "empty_cache"))


def on_te_import(module: ModuleType) -> None:
    """The start-up's callback for TE's base module: arm the net."""
    net.arm(module, TE_BASE_CLASS, FLUSHES, te_ready=_finished(TE_PACKAGE))


def _finished(name: str) -> bool:
    """Whether `name` has finished importing: only then can layers have been built already (the
    callback also runs at install() when the shim is imported after TE)."""
    import sys

    d = registry.namespace(sys.modules.get(name))
    if d is None:
        return False
    spec = d.get("__spec__")
    return not getattr(spec, "_initializing", False)
