"""CUDA's random-number state on the twin, for the callers that reach it past `torch.cuda`'s own
names: Megatron's and TE's `CudaRNGStatesTracker` (`megatron/core/tensor_parallel/random.py`,
`transformer_engine/pytorch/distributed.py`).

device.py already makes CUDA's generator the CPU's default generator (the ops run on the CPU, so
that is the generator they draw from; a tracker's `fork()` then really changes what they draw).
Two routes still lead to a CPU-only torch's CUDA code, which raises or does nothing:
- `torch.cuda.random.get_rng_state` and its siblings: a module of its own, which Megatron calls by
  that name (`_get_cuda_rng_state`); they call the real `_lazy_init` ("Torch not compiled with
  CUDA enabled");
- `torch.cuda._lazy_call(cb)`, through which both trackers set a state
  (`_set_cuda_rng_state`): it runs `cb` only once CUDA is initialised and otherwise queues it
  for an initialisation that never comes, so every state a tracker restores would be dropped.
  Here it runs `cb` at once. `torch.cuda.is_initialized()` itself stays False (device.py: there
  is no CUDA allocator to measure), which is why the call is answered here and not by claiming an
  initialised CUDA. Both trackers from-import `_lazy_call`, so modules already loaded are rebound.

`install()` after `te_twin.load` (or before: either order works), once per process.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

# Modules that bind `from torch.cuda import _lazy_call` at their import.
_BINDERS = ("transformer_engine.pytorch.distributed", "megatron.core.tensor_parallel.random")
_installed = False


def _run_now(callable: Any, **kwargs: Any) -> None:
    callable()


def install() -> None:
    """Route `torch.cuda.random`'s functions and `torch.cuda._lazy_call` to the CPU generator."""
    global _installed
    if _installed:
        return
    generator = torch.default_generator

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return generator.get_state()

    def get_rng_state_all() -> list[torch.Tensor]:
        return [generator.get_state()]

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        generator.set_state(new_state)

    def set_rng_state_all(new_states: Any) -> None:
        for state in new_states:
            generator.set_state(state)

    def manual_seed(seed: int) -> None:
        generator.manual_seed(seed)

    def seed() -> None:
        generator.seed()

    def initial_seed() -> int:
        return generator.initial_seed()

    answers: dict[str, Any] = {
        "get_rng_state": get_rng_state,
        "get_rng_state_all": get_rng_state_all,
        "set_rng_state": set_rng_state,
        "set_rng_state_all": set_rng_state_all,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": seed,
        "seed_all": seed,
        "initial_seed": initial_seed,
    }
    random = torch.cuda.random
    for name, answer in answers.items():
        setattr(random, name, answer)
    original = torch.cuda._lazy_call
    torch.cuda._lazy_call = _run_now
    for name in _BINDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "_lazy_call", None) is original:
            module._lazy_call = _run_now  # type: ignore[attr-defined]
    _installed = True
