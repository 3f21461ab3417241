"""Everything the shim is checked against in one TE release, in one fresh interpreter.

    python -m harness.te_probe 2.20.2        # prints one line: RESULT {json}

Imports the release's real code (harness/te_import.py), then:
- builds a real object of every value class TE caches (and its base/storage class) from inner
  tensors made here, of known and distinct sizes, and records what `scan` / `clear_fp8_workspaces`
  count for it against the bytes of those tensors (the oracle: nothing read back from the object);
- builds TE's real modules on CPU (Linear, LayerNormLinear, LayerNormMLP, GroupedLinear) and, where
  a constructor refuses, records why; fills a built module's cache under the keys its forward uses
  and records what the shim clears;
- records what the release has: classes, the workspace method, the cache keys in each module's
  source, `make_graphed_callables` marks (made by the real imported graph module);
- FP8 primary weights: a real `Float8Tensor` parameter with a transpose, reported and cleared or not.

tests/te/test_te_real.py runs this once per release and asserts on the record.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

ROWS, COLS = 64, 128  # distinct dims, so a transposed or misplaced tensor would show

# Where each value class may live, by release era: (module under transformer_engine, class name).
# A release has the classes whose module and name exist in it; tests/te/test_te_real.py checks that
# against te_releases.BOUNDARIES.
VALUE_CLASSES = {
    "Float8Tensor": ("pytorch.float8_tensor", "pytorch.tensor.float8_tensor"),
    "Float8TensorBase": ("pytorch.tensor._internal.float8_tensor_base",),
    "Float8TensorStorage": ("pytorch.tensor.storage.float8_tensor_storage",),
    "MXFP8Tensor": ("pytorch.tensor.mxfp8_tensor",),
    "MXFP8TensorBase": ("pytorch.tensor._internal.mxfp8_tensor_base",),
    "MXFP8TensorStorage": ("pytorch.tensor.storage.mxfp8_tensor_storage",),
    "Float8BlockwiseQTensor": ("pytorch.tensor.float8_blockwise_tensor",),
    "Float8BlockwiseQTensorBase": ("pytorch.tensor._internal.float8_blockwise_tensor_base",),
    "Float8BlockwiseQTensorStorage": ("pytorch.tensor.storage.float8_blockwise_tensor_storage",),
    "NVFP4Tensor": ("pytorch.tensor.nvfp4_tensor",),
    "NVFP4TensorBase": ("pytorch.tensor._internal.nvfp4_tensor_base",),
    "NVFP4TensorStorage": ("pytorch.tensor.storage.nvfp4_tensor_storage",),
    "GroupedTensor": ("pytorch.tensor.grouped_tensor",),
    "GroupedTensorStorage": ("pytorch.tensor.storage.grouped_tensor_storage",),
    "IdentityTensor": ("pytorch.tensor.identity_tensor",),
    "IdentityTensorStorage": ("pytorch.tensor.storage.identity_tensor_storage",),
    "HybridQuantizedTensor": ("pytorch.tensor.hybrid_tensor",),
    "HybridQuantizedTensorStorage": ("pytorch.tensor.storage.hybrid_tensor_storage",),
    "DebugQuantizedTensor": ("debug.pytorch.debug_quantization",),
}
MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
WORKSPACE_METHODS = ("get_fp8_workspace", "get_weight_workspace", "quantize_weight")


def _find_class(name: str) -> Any:
    from harness import te_import

    for where in VALUE_CLASSES[name]:
        module = te_import.submodule(where)
        if module is not None and isinstance(getattr(module, name, None), type):
            return getattr(module, name)
    return None


class _Maker:
    """Builds a value of a TE class by its constructor's parameter names, from tensors made here."""

    def __init__(self, torch: Any, classes: dict[str, Any]) -> None:
        self.torch = torch
        self.classes = classes
        self.made: list[Any] = []  # every tensor handed to a constructor: the oracle
        self.by_name: dict[str, Any] = {}
        dtype_enum = getattr(_module("pytorch.constants"), "DType", None)
        if dtype_enum is None or not hasattr(dtype_enum, "kFloat8E4M3"):
            dtype_enum = sys.modules["transformer_engine_torch"].DType
        self.fp8 = dtype_enum.kFloat8E4M3
        self.fp4 = getattr(dtype_enum, "kFloat4E2M1", self.fp8)

    def tensor(self, shape: tuple[int, ...], dtype: Any) -> Any:
        t = self.torch.zeros(shape, dtype=dtype)
        self.made.append(t)
        return t

    def argument(self, name: str, cls_name: str) -> Any:
        torch, u8, f32 = self.torch, self.torch.uint8, self.torch.float32
        groups = 2
        shapes = {
            "data": ((ROWS, COLS), u8),
            "data_transpose": ((COLS, ROWS), u8),
            "fp8_scale_inv": ((1,), f32),
            "rowwise_data": ((ROWS, COLS), u8),
            "columnwise_data": ((COLS, ROWS), u8),
            "rowwise_scale_inv": ((ROWS, COLS // 32), u8),
            "columnwise_scale_inv": ((COLS, ROWS // 32), u8),
            "amax_rowwise": ((1,), f32),
            "amax_columnwise": ((1,), f32),
            "hp_data": ((ROWS, COLS), torch.bfloat16),
            "scale_inv": ((groups, 3), f32),
            "amax": ((groups,), f32),
            "columnwise_amax": ((groups, 5), f32),
            "scale": ((groups, 7), f32),
            "first_dims": ((groups,), torch.int64),
            "last_dims": ((groups, 1), torch.int64),
            "tensor_offsets": ((groups + 1,), torch.int64),
        }
        if cls_name.startswith("Grouped") and name in ("data", "columnwise_data"):
            return self.tensor((groups * ROWS * COLS,), u8)
        if name in shapes:
            self.by_name[name] = self.tensor(*shapes[name])
            return self.by_name[name]
        if name in ("rowwise_storage", "rowwise_gemm_tensor"):
            return self.value(self._nested("Float8Tensor"))
        if name in ("columnwise_storage", "columnwise_gemm_tensor"):
            return self.value(self._nested("MXFP8Tensor"))
        fixed = {
            "fp8_dtype": self.fp8,
            "fp4_dtype": self.fp4,
            "quantizer": None,
            "is_2D_scaled": True,
            "with_gemm_swizzled_scales": False,
            "dtype": torch.float32,
            "fake_dtype": torch.float32,
            "requires_grad": False,
            "num_tensors": groups,
            "shapes": [(ROWS, COLS)] * groups,
        }
        if name == "shape":
            return (groups * ROWS, COLS) if cls_name.startswith("Grouped") else (ROWS, COLS)
        if name == "data_format":
            return sys.modules["transformer_engine_torch"].Float8BlockScaleTensorFormat.GEMM_READY
        return fixed.get(name, inspect.Parameter.empty)

    def _nested(self, preferred: str) -> str:
        # storage / base classes first: before 2.10 the tensor classes cannot be built on CPU
        for name in (f"{preferred}Storage", f"{preferred}Base", preferred, "Float8TensorStorage", "Float8TensorBase"):
            if self.classes.get(name) is not None:
                return name
        raise LookupError(preferred)

    def value(self, cls_name: str) -> Any:
        cls = self.classes[cls_name]
        init = cls.__dict__.get("__new__") or cls.__dict__.get("__init__")
        for klass in cls.__mro__:  # the constructor that names the fields (a subclass may take **kwargs)
            init = klass.__dict__.get("__new__") or klass.__dict__.get("__init__")
            if init is not None and len(inspect.signature(init).parameters) > 3:
                break
        kwargs = {}
        params = inspect.signature(init).parameters
        for name, param in params.items():
            if name in ("cls", "self") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            arg = self.argument(name, cls_name)
            if arg is not inspect.Parameter.empty:
                kwargs[name] = arg
        if cls_name.startswith("Hybrid"):  # its storage refuses any other quantizer
            kwargs["quantizer"] = _hybrid_quantizer()
        takes_more = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if issubclass(cls, self.torch.Tensor) and takes_more:  # QuantizedTensor.__new__ takes these
            kwargs.setdefault("shape", (ROWS, COLS))
            kwargs.setdefault("dtype", self.torch.float32)
            if _takes_device(cls):  # 2.10+; before, the wrapper goes to torch.cuda.current_device()
                kwargs["device"] = self.torch.device("cpu")
        return cls(**kwargs)


def _takes_device(cls: type) -> bool:
    for klass in cls.__mro__:
        new = klass.__dict__.get("__new__")
        if new is not None and "device" in inspect.signature(new).parameters:
            return True
    return False


def _hybrid_quantizer() -> Any:
    hybrid = _module("pytorch.tensor.hybrid_tensor")
    identity = _module("pytorch.tensor.identity_tensor")
    return hybrid.HybridQuantizer(  # type: ignore[union-attr]
        rowwise_quantizer=identity.IdentityQuantizer(),  # type: ignore[union-attr]
        columnwise_quantizer=identity.IdentityQuantizer(),  # type: ignore[union-attr]
    )


def _module(name: str) -> Any:
    from harness import te_import

    try:
        return te_import.submodule(name)
    except Exception:
        return None


def _fields(value: Any) -> dict[str, Any]:
    """The value's attributes, properties included (1.x reads `_transpose` through one)."""
    names = set(getattr(value, "__dict__", {})) | {
        n for klass in type(value).__mro__ for n, a in vars(klass).items() if isinstance(a, property)
    }
    out = {}
    for name in names:
        try:
            out[name] = getattr(value, name)
        except Exception:
            continue
    return out


def _oracle(torch: Any, tensors: list[Any]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    storages.pop(0, None)
    return sum(storages.values())


def _holder(torch: Any, value: Any) -> Any:
    holder = torch.nn.Module()
    holder.__dict__["_fp8_workspaces"] = {"weight": value}
    return holder


def probe_values(torch: Any) -> dict[str, Any]:
    from te_offload_shim.te.caches import clear_fp8_workspaces, scan

    classes = {name: _find_class(name) for name in VALUE_CLASSES}
    out: dict[str, Any] = {}
    for name, cls in classes.items():
        if cls is None:
            continue
        record: dict[str, Any] = {"module": cls.__module__}
        maker = _Maker(torch, classes)
        try:
            value = maker.value(name)
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["trace"] = traceback.format_exc(limit=-4)
            out[name] = record
            continue
        record["tensors"] = len(maker.made)
        made = {id(t) for t in maker.made}
        record["fields"] = sorted(k for k, v in _fields(value).items() if id(v) in made)
        record["expected"] = _oracle(torch, maker.made)
        holder = _holder(torch, value)
        seen = scan(holder)
        record["scan"] = seen.bytes + seen.bytes_shared
        report = clear_fp8_workspaces(holder, strict=False)
        record["cleared"] = report.bytes
        record["entries"] = report.entries
        record["left"] = len(holder.__dict__["_fp8_workspaces"])
        record["errors"] = report.errors
        out[name] = record
    return out


def cache_keys(source: str) -> list[str]:
    """The keys a TE module's source stores workspaces under: string constants (f"weight{i}" as
    "weight{i}") given as `cache_name=`, used as `_fp8_workspaces[...]` / `_fp8_workspaces.get(...)`,
    or assigned to the variable used there."""
    tree = ast.parse(source)
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
    used: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "cache_name":
            used.append(node.value)
        elif isinstance(node, ast.Subscript) and _is_workspaces(node.value):
            used.append(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _is_workspaces(node.func.value)
            and node.args
        ):
            used.append(node.args[0])
    keys: set[str] = set()
    seen: set[str] = set()
    while used:
        expr = used.pop()
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value:
                keys.add(sub.value)
            elif isinstance(sub, ast.JoinedStr):
                keys.add("".join(str(v.value) if isinstance(v, ast.Constant) else "{i}" for v in sub.values))
                break
            elif isinstance(sub, ast.Name) and sub.id not in seen:
                seen.add(sub.id)
                used.extend(assigned.get(sub.id, ()))
    return sorted(keys)


def _is_workspaces(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "_fp8_workspaces"


def probe_modules(torch: Any) -> dict[str, Any]:
    from te_offload_shim.te.caches import clear_fp8_workspaces

    package = _module("pytorch.module")
    out: dict[str, Any] = {}
    for name in MODULES:
        cls = getattr(package, name, None) if package is not None else None
        record: dict[str, Any] = {}
        if cls is None:
            record["absent"] = True
            out[name] = record
            continue
        source = Path(inspect.getfile(cls)).read_text()
        record["keys"] = cache_keys(source)
        args: tuple = (4, 32, 16) if name == "GroupedLinear" else (32, 16)
        try:
            module = cls(*args, params_dtype=torch.float32, device="cpu")
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            out[name] = record
            continue
        record["built"] = True
        workspaces = module.__dict__.get("_fp8_workspaces")
        record["workspaces_dict"] = type(workspaces) is dict
        if type(workspaces) is dict:
            weights = [k.replace("{i}", str(i)) for k in record["keys"] for i in range(args[0] if "{i}" in k else 1)]
            made = []
            for key in weights:
                t = torch.zeros(3, 5, dtype=torch.uint8)
                made.append(t)
                workspaces[key] = t
            report = clear_fp8_workspaces(torch.nn.Sequential(module), strict=False)
            record["filled"] = len(weights)
            record["cleared_entries"] = report.entries
            record["cleared_bytes"] = report.bytes
            record["expected_bytes"] = _oracle(torch, made)
            record["left"] = len(workspaces)
        out[name] = record
    return out


# The constructor arguments that become a quantized parameter's second-direction copy.
_COPY_ARGS = ("data_transpose", "columnwise_data", "columnwise_scale_inv", "amax_columnwise")


def probe_primary_weights(torch: Any) -> dict[str, Any]:
    """FP8 primary weights: a real quantized tensor made a parameter of a TE-like layer (as
    `fp8_model_init` does); what the shim reports of its transpose / columnwise copy."""
    from te_offload_shim.te.caches import clear_fp8_workspaces, scan

    # Making a quantized tensor a parameter detaches it, and TE 2.4 - 2.12's `make_like` then builds
    # the wrapper on `torch.cuda.current_device()` (quantized_tensor.py): answered as the CPU, the one
    # device here (this probe runs in a process of its own).
    torch.cuda.current_device = lambda: "cpu"
    classes = {name: _find_class(name) for name in VALUE_CLASSES}
    out: dict[str, Any] = {}
    for name in ("Float8Tensor", "MXFP8Tensor", "Float8BlockwiseQTensor", "NVFP4Tensor"):
        if classes.get(name) is None:
            continue
        maker = _Maker(torch, classes)
        try:
            param = torch.nn.Parameter(maker.value(name), requires_grad=False)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        layer = torch.nn.Module()
        layer.__dict__["_fp8_workspaces"] = {}  # TE creates none for a primary weight
        layer.weight = param
        report = scan(torch.nn.Sequential(layer))
        copies = [maker.by_name[a] for a in _COPY_ARGS if a in maker.by_name]
        record = out[name] = {
            "expected": _oracle(torch, copies),
            "reported": report.primary_weight_bytes,
            "params": report.primary_weight_params,
            "where": report.primary_weight_where,
            "entries": report.entries,
        }
        _no_device_query(param)
        cleared = clear_fp8_workspaces(torch.nn.Sequential(layer), strict=False)
        record["clear"] = {
            "cleared": cleared.primary_weight_cleared,
            "dropped_by": cleared.primary_weight_dropped_by,
            "left": cleared.primary_weight_bytes,
            "errors": cleared.errors,
            "copies_kept": [a for a in _COPY_ARGS if a in maker.by_name and _holds(param, maker.by_name[a])],
            "data_kept": any(_holds(param, maker.by_name[a]) for a in ("data", "rowwise_data") if a in maker.by_name),
        }
    return out


def _holds(value: Any, tensor: Any) -> bool:
    return any(v is tensor for v in _fields(value).values())


def _no_device_query(value: Any) -> None:
    """TE's `update_usage` asks the GPU whether non-TN FP8 GEMMs exist (`is_non_tn_fp8_gemm_supported`,
    a torch.cuda capability query); on CPU the answer is "no" (Hopper's), set where TE reads it."""
    for klass in type(value).__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, "is_non_tn_fp8_gemm_supported"):
            module.is_non_tn_fp8_gemm_supported = lambda: False  # type: ignore[attr-defined]


def rebuild_calls(folder: Path) -> dict[str, int]:
    """Per module, how many `<weight>.update_usage(columnwise_usage=True)` calls its source makes
    (the backward rebuilding a dropped FP8 weight transpose)."""
    import re

    pattern = re.compile(r"\b\w*weight\w*\.update_usage\((?:rowwise_usage=\w+, )?columnwise_usage=True\)")
    out = {}
    for name, file in (("Linear", "linear"), ("LayerNormLinear", "layernorm_linear"),
                       ("LayerNormMLP", "layernorm_mlp"), ("GroupedLinear", "grouped_linear")):  # fmt: skip
        path = folder / "transformer_engine" / "pytorch" / "module" / f"{file}.py"
        out[name] = len(pattern.findall(path.read_text())) if path.is_file() else 0
    return out


def probe_graph_marks(torch: Any, release: str) -> dict[str, Any]:
    """TE's real graph module (imported) marks a chunk the way make_graphed_callables does; does the
    shim leave that chunk's caches alone?"""
    from harness import te_graph, te_releases
    from te_offload_shim.te.caches import clear_fp8_workspaces

    graph = _module("pytorch.graph")
    if graph is None or not hasattr(graph, "make_graphed_callables"):
        return {"absent": True}
    out: dict[str, Any] = {}
    for order in (False, True):
        layer = torch.nn.Module()
        layer.linear = torch.nn.Linear(4, 4)
        layer.linear.__dict__["_fp8_workspaces"] = {"weight": torch.zeros(4, dtype=torch.uint8)}
        te_graph.mark_like_make_graphed_callables(
            layer, te_releases.folder(release), order=order, globals_=graph.__dict__
        )
        marks = sorted(k for k, v in vars(layer).items() if getattr(v, "__module__", None) == graph.__name__)
        report = clear_fp8_workspaces(torch.nn.Sequential(layer), strict=False)
        out["order" if order else "plain"] = {
            "marks": {k: getattr(layer, k).__qualname__ for k in marks},
            "cleared": report.entries,
            "left": len(layer.linear.__dict__["_fp8_workspaces"]),
            "reason": report.skipped[0].reason if report.skipped else None,
        }
    return out


def probe_release(release: str) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import torch

    from harness import te_import

    te_import.load(release)
    result: dict[str, Any] = {"release": release, "init_skipped": te_import.INIT_SKIPPED}
    base = _module("pytorch.module.base")
    module_class = getattr(base, "TransformerEngineBaseModule", None)
    # a method of the base module (1.8 - 2.14), a module-level function of base.py (2.15+)
    result["workspace_methods"] = [m for m in WORKSPACE_METHODS if hasattr(module_class, m) or hasattr(base, m)]
    result["values"] = probe_values(torch)
    result["modules"] = probe_modules(torch)
    result["graph"] = probe_graph_marks(torch, release)
    result["primary_weights"] = probe_primary_weights(torch)
    from harness import te_releases

    result["te_version"] = getattr(sys.modules.get("transformer_engine"), "__version__", None)
    result["rebuild_calls"] = rebuild_calls(te_releases.folder(release))
    return result


def _warm() -> None:
    """Import once, before forking, what every release's TE imports anyway: torch, TorchDynamo and
    Inductor (TE's jit.py), triton and onnxscript (TE's own dependencies). Nothing is run."""
    warnings.filterwarnings("ignore")
    from harness import te_releases

    sys.path[len(sys.path) :] = [str(p) for p in te_releases.PYDEPS]
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401

    for name in ("triton", "triton.language", "onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            pass
    sys.path[-len(te_releases.PYDEPS) :] = []


def _one(release: str) -> dict[str, Any]:
    try:
        return probe_release(release)
    except Exception:
        return {"release": release, "fatal": traceback.format_exc()}


def main(argv: list[str]) -> int:
    """One release: probe it here. Several: import the shared part once, then probe each release in
    a forked child (TE is imported once per process: releases cannot share an interpreter)."""
    import os

    if len(argv) == 1:
        print("RESULT " + json.dumps(_one(argv[0])), flush=True)
        return 0
    _warm()
    for release in argv:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: probe, send the record, leave without running the parent's exit code
            os.close(read)
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(_one(release)))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"release": release, "fatal": f"probe process ended with status {status}"})
        print("RESULT " + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
