"""An import-only Transformer Engine: lets modules that import TE at their top import on a CPU machine.

TE's compiled part cannot be installed without CUDA. Some frameworks' modules (ms-swift's megatron
trainers, through `mcore_bridge`) import `transformer_engine` and subclass megatron's TE wrappers at
import time, but their model offload never calls TE. `install()` puts a meta-path finder in front
that serves every `transformer_engine*` module as a permissive stand-in: any attribute is a fresh
class (so it can be subclassed, called, used in `isinstance`), with a plausible `__version__`.
Nothing here implements TE; a test that reached TE code through it would fail loudly.

`serve("flash_attn")` serves another top-level package (and not TE), for the same
reason: a CUDA-only package that cannot be installed here, imported at the top of a framework's
module whose offload never calls it (siiRL's workers import `flash_attn.bert_padding`, Trinity-RFT's
Megatron workers `import vllm` for its side effect on NCCL). Only TE's modules get a `__version__`.

Only for tests whose code path is known not to call TE: the FP8 caches themselves are the layout
stand-ins of `harness/te_standins.py`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

VERSION = "2.14.0"  # a TE release with `_fp8_workspaces`; megatron-core 0.16 gates features on it
_TE = ("transformer_engine", "transformer_engine_torch")
_served: set[str] = set()  # the top-level package names the finder answers for


class _AnyMeta(type):
    """Class attributes are more stand-in classes, so `te.pytorch.Linear.forward` resolves."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__qualname__}.{name}")


def _stand_in(name: str) -> type:
    return _AnyMeta(name.rpartition(".")[2] or name, (), {"__qualname__": name, "__module__": "transformer_engine"})


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stand_in(f"{self.__name__}.{name}")
        setattr(self, name, value)  # the same object on every access
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in _served:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        if spec.name.split(".")[0] in _TE:
            module.__version__ = VERSION  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


FINDER = _Finder()


def install() -> None:
    """Serve `transformer_engine*` from the stand-in (first on the meta path; idempotent)."""
    serve(*_TE)


def serve(*packages: str) -> None:
    """Serve these top-level packages and their submodules from the stand-in (TE only if named)."""
    _served.update(packages)
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)
