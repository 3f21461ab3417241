"""Import Transformer Engine's real Python code from a release's wheel (`.deps/te-X`) on a CPU machine.

What is replaced, and nothing else:
- the compiled extension `transformer_engine_torch` (imported by TE as `tex`): a module whose every
  attribute is a class made on first use: distinct, hashable, usable as a base class, callable (a
  call returns the class itself), an int in the order first read (an enum member); `FP8FwdTensors`
  / `FP8BwdTensors` are IntEnums with the extension's values (TE indexes its scale tensors with
  them). Nothing TE computes with it is used: the tests build objects from tensors they made;
- the shared-library loading: `transformer_engine/common/__init__.py` is imported with TE's own
  build switch `NVTE_PROJECT_BUILDING=1`, which skips its ctypes loading of cuDNN, NVRTC and the
  core library;
- `transformer_engine/pytorch/__init__.py` runs as released except its one top-level statement that
  loads the extension (`_load_library()` 1.x - 2.3, `load_framework_extension("torch")` 2.4+),
  which is dropped (exactly one, or the import fails). Everything else is the release's own code,
  imported by its real module names.

One release per interpreter: call `load(release)` once, in a fresh process.
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

from harness import te_releases

EXTENSION = "transformer_engine_torch"
# Two enums of the extension whose values TE uses as indices into its scale/amax tensors
# (transformer_engine/common/include/transformer_engine/transformer_engine.h, FP8 tensor slots).
_ENUMS = {
    "FP8FwdTensors": {
        "GEMM1_INPUT": 0,
        "GEMM1_WEIGHT": 1,
        "GEMM1_OUTPUT": 2,
        "GEMM2_INPUT": 3,
        "GEMM2_WEIGHT": 4,
        "GEMM2_OUTPUT": 5,
        "GEMM3_INPUT": 6,
        "GEMM3_WEIGHT": 7,
        "GEMM3_OUTPUT": 8,
    },
    "FP8BwdTensors": {
        "GRAD_OUTPUT1": 0,
        "GRAD_INPUT1": 1,
        "GRAD_OUTPUT2": 2,
        "GRAD_INPUT2": 3,
        "GRAD_OUTPUT3": 4,
        "GRAD_INPUT3": 5,
    },
}


class _Native(type):
    """The metaclass of every stand-in name of the extension: reading a missing attribute makes a
    new one, numbered in order (an enum member: TE's Python mirrors of the extension's enums, e.g.
    `constants.DType`, get distinct values). `__members__` lists the names TE's code has read, so
    TE's own checks that its mirrors name every member (pytorch/constants.py, 2.20) hold."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):  # private names are Python's or a probe's (hasattr(x, "_data")), never TE's
            raise AttributeError(name)
        value = _Member(name, (), {"__module__": EXTENSION, "_index": len(cls.__members__)})
        setattr(cls, name, value)
        return value

    @property
    def __members__(cls) -> dict[str, Any]:
        return {k: v for k, v in vars(cls).items() if isinstance(v, _Member)}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls

    def __index__(cls) -> int:
        return 0

    __int__ = __index__

    def __bool__(cls) -> bool:
        return True


class _Member(type):
    """A member of a stand-in enum: an int, a name, nothing else (no made-up attributes)."""

    @property
    def name(cls) -> str:
        return cls.__name__

    @property
    def value(cls) -> int:
        return cls._index  # type: ignore[attr-defined]

    def __index__(cls) -> int:
        return cls._index  # type: ignore[attr-defined]

    __int__ = __index__


def _native(name: str) -> Any:
    return _Native(name, (), {"__module__": EXTENSION})


class _Extension(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        members = _ENUMS.get(name)
        value = enum.IntEnum(name, members, module=EXTENSION) if members else _native(name)  # type: ignore[misc]
        setattr(self, name, value)
        return value


def _empty_package(name: str) -> types.ModuleType:
    """The package `name` from its real spec, its `__init__` not executed yet."""
    parent, _, child = name.rpartition(".")
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not a package on sys.path")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


# The top-level statement of transformer_engine/pytorch/__init__.py that loads the extension:
# `_load_library()` (1.x - 2.3, defined in that file), `load_framework_extension("torch")` (2.4+).
_LOADERS = ("_load_library", "load_framework_extension")


def without_extension_loading(path: Path) -> types.CodeType:
    """The code of TE's pytorch/__init__.py with exactly its one extension-loading statement dropped."""
    tree = ast.parse(path.read_text(), str(path))
    kept = [
        node
        for node in tree.body
        if not (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in _LOADERS
        )
    ]
    if len(tree.body) - len(kept) != 1:
        raise ImportError(f"{path}: expected one extension-loading statement, found {len(tree.body) - len(kept)}")
    tree.body = kept
    return compile(tree, str(path), "exec")


def star_imported_names(folder: Path) -> list[str]:
    """The names `pytorch/cpp_extensions/__init__.py`'s `from transformer_engine_torch import *` must
    provide: every `tex.NAME` in the release's code and every name imported from `cpp_extensions` or
    the extension (the real definitions in cpp_extensions' own files are star-imported after it)."""
    names: set[str] = set()
    for path in (folder / "transformer_engine").rglob("*.py"):
        text = path.read_text(errors="replace")
        names.update(re.findall(r"\btex\.([A-Za-z_]\w*)", text))
        if "cpp_extensions import" not in text and "transformer_engine_torch import" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(("cpp_extensions", EXTENSION)):
                names.update(alias.name for alias in node.names if alias.name != "*")
    return sorted(n for n in names if not n.startswith("_"))


# The top-level __init__ tries these in try/except ImportError; without JAX/Paddle they fail, after
# seconds of package-metadata look-ups in their own library loading. Marked absent, they fail at once.
_OTHER_FRAMEWORKS = ("transformer_engine.jax", "transformer_engine.paddle")
# Why the release's pytorch/__init__.py could not run on this torch (None: it ran).
INIT_SKIPPED: str | None = None


def load(release: str, extension: types.ModuleType | None = None) -> types.ModuleType:
    """Put `.deps/te-<release>` first on sys.path and import `transformer_engine` and
    `transformer_engine.pytorch` from it, replaced parts as described above. Returns the latter.
    `extension`: the module to serve as `transformer_engine_torch` instead of the stand-in above
    (harness/te_twin's CPU twin, whose kernels compute)."""
    if "transformer_engine" in sys.modules:
        raise RuntimeError("transformer_engine is already imported in this interpreter")
    if not te_releases.installed(release):
        raise FileNotFoundError(f"TE {release} is not in {te_releases.folder(release)} (run scripts/setup-env.sh)")
    sys.path[:0] = [str(te_releases.folder(release)), *map(str, te_releases.PYDEPS)]
    if extension is None:
        extension = _Extension(EXTENSION, "stand-in for TE's compiled extension (harness/te_import.py)")
        extension.__all__ = star_imported_names(te_releases.folder(release))  # type: ignore[attr-defined]
    sys.modules[EXTENSION] = extension
    for absent in _OTHER_FRAMEWORKS:  # TE's JAX / Paddle bindings: their import is tried and fails anyway
        sys.modules.setdefault(absent, None)  # type: ignore[arg-type]
    before = os.environ.get("NVTE_PROJECT_BUILDING")
    os.environ["NVTE_PROJECT_BUILDING"] = "1"
    try:
        top = _empty_package("transformer_engine")
        importlib.import_module("transformer_engine.common")  # real; the switch skips its library loading
        pytorch = _empty_package("transformer_engine.pytorch")
        try:
            exec(without_extension_loading(Path(pytorch.__file__)), pytorch.__dict__)  # type: ignore[arg-type]
        except ImportError as exc:
            # TE 1.x's __init__ imports attention -> softmax, which needs `torch.onnx._type_utils`
            # (gone from torch 2.6+). Its submodules still import one by one: say so, go on without it.
            global INIT_SKIPPED
            INIT_SKIPPED = f"transformer_engine/pytorch/__init__.py not run: {type(exc).__name__}: {exc}"
            for name in [m for m in sys.modules if m.startswith("transformer_engine.pytorch")]:
                del sys.modules[name]
            pytorch = _empty_package("transformer_engine.pytorch")
        # The real top-level __init__ (finds .common and .pytorch imported, tries .jax / .paddle).
        top.__spec__.loader.exec_module(top)  # type: ignore[union-attr]
    finally:
        if before is None:
            os.environ.pop("NVTE_PROJECT_BUILDING", None)
        else:
            os.environ["NVTE_PROJECT_BUILDING"] = before
    return pytorch


def submodule(name: str) -> types.ModuleType | None:
    """`transformer_engine.<name>`, or None when the release has no such file."""
    full = f"transformer_engine.{name}"
    try:
        if importlib.util.find_spec(full) is None:
            return None
    except ModuleNotFoundError:
        return None
    return importlib.import_module(full)
