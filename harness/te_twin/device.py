"""The device the twin answers as: one CUDA GPU of a chosen architecture, whose memory is the CPU's.

TE's Python asks torch (and its extension) what GPU it runs on and gates recipes and layouts on the
answer: FP8 GEMM layouts on the SM version (Hopper, sm90, runs only "TN" FP8 GEMMs, so TE keeps a
transpose of each FP8 weight; Blackwell, sm100, runs any layout and MXFP8), MXFP8 / NVFP4 on sm100,
the cuBLAS workspace size on the major version. Only those queries are answered here; nothing
computes. `install(arch)` replaces them process-wide (one twin per interpreter).

What each answer is, and why:
- `is_available`, `device_count` (1), `current_device` (0), `get_device_capability`,
  `get_device_properties`: one device of `arch`;
- streams, events, `synchronize`, `nvtx`, graph-capture status: the CPU runs everything in order
  on one stream, so a stream is a no-op context and an event has nothing to wait for;
- the RNG: TE's `CudaRNGStatesTracker` (and Megatron's) save and restore CUDA's generator state
  around random ops; the ops run on the CPU, so CUDA's generator *is* the CPU's default generator
  (`default_generators`, `get/set_rng_state`, `manual_seed[_all]`);
- `torch.version.cuda`: a CUDA 12.9 build (TE gates FP8 block scaling on it);
- `Tensor.is_cuda`: True for a CPU tensor (TE 2.9+ refuses inputs that are not on the GPU), but
  for a tensor an offload moved to the host (host.py), which answers False as on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

ARCHS = {90: ("NVIDIA H100 80GB HBM3 (CPU twin)", (9, 0)), 100: ("NVIDIA B200 (CPU twin)", (10, 0))}
CUDA_VERSION = "12.9"  # FP8 block scaling needs CUDA 12.9 (TE 2.20 quantization.py)
_installed: int | None = None


def arch() -> int:
    """The SM version answered (90 or 100); 90 before `install`."""
    return _installed if _installed is not None else 90


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """The fields of `torch.cuda.get_device_properties` that TE reads (major, minor, name, SMs)."""

    name: str
    major: int
    minor: int
    multi_processor_count: int = 132
    total_memory: int = 80 * 1024**3
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    L2_cache_size: int = 50 * 1024**2
    warp_size: int = 32
    uuid: str = "twin-0"


class Stream:
    """A CUDA stream on a machine that runs every op in order: waiting and recording are no-ops."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Event:
        return event if event is not None else Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


class Event:
    """A CUDA event: everything before it has already run."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Event) -> float:
        return 0.0


_STREAM = Stream()


@contextlib.contextmanager
def _stream(stream: Any = None) -> Any:
    yield stream


@contextlib.contextmanager
def _nvtx_range(*args: Any, **kwargs: Any) -> Any:
    yield


class _Device(contextlib.nullcontext):
    """`torch.cuda.device(i)`: there is one device; entering it changes nothing."""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self.idx = 0


def install(sm: int = 90) -> None:
    """Answer torch's CUDA queries as one device of SM version `sm` (90: Hopper, 100: Blackwell)."""
    global _installed
    import torch

    from harness.te_twin import host

    if sm not in ARCHS:
        raise ValueError(f"the twin answers as sm90 or sm100, not sm{sm}")
    if _installed is not None:
        if _installed != sm:
            raise RuntimeError(f"the twin already answers as sm{_installed} in this process")
        return
    name, (major, minor) = ARCHS[sm]
    props = DeviceProperties(name, major, minor)
    cuda = torch.cuda
    generator = torch.default_generator
    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: False,  # no CUDA allocator: the shim's released_bytes stays None
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_capability": lambda device=None: (major, minor),
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: name,
        "is_bf16_supported": lambda including_emulation=True: True,
        "is_bf16_compatible": lambda: True,
        "synchronize": lambda device=None: None,
        "current_stream": lambda device=None: _STREAM,
        "default_stream": lambda device=None: _STREAM,
        "set_stream": lambda stream: None,
        "stream": _stream,
        "Stream": Stream,
        "Event": Event,
        "device": _Device,
        "is_current_stream_capturing": lambda: False,
        "empty_cache": lambda: None,  # nothing is cached: CPU memory goes back when a tensor dies
        "default_generators": (generator,),
        "get_rng_state": lambda device="cuda": generator.get_state(),
        "set_rng_state": lambda state, device="cuda": generator.set_state(state),
        "manual_seed": lambda seed: generator.manual_seed(seed),
        "manual_seed_all": lambda seed: generator.manual_seed(seed),
        "seed": lambda: generator.seed(),
        "initial_seed": lambda: generator.initial_seed(),
    }
    for key, value in answers.items():
        setattr(cuda, key, value)
    cuda.nvtx.range = _nvtx_range  # type: ignore[assignment]
    cuda.nvtx.range_push = lambda msg: 0  # type: ignore[assignment]
    cuda.nvtx.range_pop = lambda: 0  # type: ignore[assignment]
    torch.version.cuda = CUDA_VERSION  # type: ignore[misc]

    # TE 2.9+ checks `inp.is_cuda` before a forward: the one device's memory is the CPU's, but for
    # what an offload moved to the host (host.py)
    def is_cuda(tensor: Any) -> bool:
        kind = tensor.device.type
        return kind == "cuda" or (kind == "cpu" and not host.is_host(tensor))

    torch.Tensor.is_cuda = property(is_cuda)  # type: ignore[assignment,method-assign]
    # torch's device-generic API (2.6+) delegates `is_available` to the answer above, then asks a
    # CUDA build's driver for the current stream (TorchDynamo does at every compile, torch 2.14+):
    # the twin's device has no accelerator there, as a CPU build has none
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        accelerator.is_available = lambda: False
    _installed = sm
