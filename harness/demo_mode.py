"""Which Transformer Engine the demo (demo/demo.py) runs on this machine, and why (the demo prints
the choice in its header).

- "te": TE's real kernels on a CUDA GPU: torch sees a GPU and TE's compiled extension
  (`transformer_engine_torch`, the `transformer-engine[pytorch]` build) imports. No twin, no
  stand-ins; the figures include the driver-visible memory (`torch.cuda.mem_get_info`).
- "twin": no GPU, TE's Python from its PyPI wheel in `.deps/te-X` on the CPU twin of its extension
  (harness/te_twin).
- "standins": neither (a GPU without TE's extension: the twin cannot share a process with a real
  GPU; or no TE wheel set up): megatron's local layers with stand-in caches in TE's layout.

`choose` is the decision alone (tests/tools/test_demo_mode.py); `facts` looks at the
machine, importing nothing the decision does not need.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util


@dataclasses.dataclass(frozen=True)
class Facts:
    cuda: bool  # torch sees a CUDA GPU
    te_extension: str | None  # why TE's compiled extension does not import; None when it does
    twin_release_installed: bool  # the TE wheel the twin runs is in .deps


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str  # "te", "twin" or "standins"
    why: str


def choose(facts: Facts, forced: str | None = None) -> Mode:
    """The demo's mode for these facts; `forced` (demo.py --mode) must be possible or it raises."""
    if facts.cuda and facts.te_extension is None:
        mode = Mode("te", "CUDA GPU and TE's compiled extension: TE's real kernels")
    elif facts.cuda:
        mode = Mode("standins", f"CUDA GPU without TE's compiled extension ({facts.te_extension})")
    elif facts.twin_release_installed:
        mode = Mode("twin", "no CUDA GPU: TE's own Python on the CPU twin of its extension")
    else:
        mode = Mode("standins", "no CUDA GPU and no TE wheel for the twin (scripts/setup-env.sh --demo)")
    if forced is not None and forced != mode.name:
        raise RuntimeError(f"--mode {forced} is not possible here: this machine gives {mode.name!r} ({mode.why})")
    return mode


def te_extension_error() -> str | None:
    """Why `transformer_engine_torch` (TE's compiled extension) does not import; None when it does."""
    if importlib.util.find_spec("transformer_engine_torch") is None:
        return "transformer_engine_torch is not installed"
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # any failure to load the real library: it is not usable here
        return f"{type(exc).__name__}: {exc}"
    return None


def facts(twin_release: str) -> Facts:
    """The facts of this machine. Reads TE's extension only where torch sees a GPU (on a CPU
    machine the twin provides the extension's name instead)."""
    import torch

    from harness import te_releases

    cuda = torch.cuda.is_available()
    return Facts(
        cuda=cuda,
        te_extension=te_extension_error() if cuda else "no CUDA GPU",
        twin_release_installed=te_releases.installed(twin_release),
    )
