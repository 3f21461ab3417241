"""The Transformer Engine releases the tests import from PyPI, and where each one lives.

`transformer-engine==X` on PyPI is a ~1.2 MB `py3-none-any` wheel holding TE's pure-Python code
(1.9.0 is an empty meta wheel: its code is in 1.9.0.post1). `scripts/setup-env.sh` installs each
release `--no-deps` into `.deps/te-X` (the folder named by the release, post suffix dropped).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
# TE's own dependencies that its modules import at their top, --no-deps folders shared by every
# release: onnx / onnxscript (ONNX export hooks, 2.9+), einops; triton (TE's Triton kernels are
# imported by transformer_engine/pytorch/__init__.py and, from 2.19, by distributed.py; defining
# them needs only the Python side of triton, nothing runs).
PYDEPS = (DEPS / "te-pydeps", DEPS / "triton")

# (release, pip requirement); the list in scripts/setup-env.sh must match (tests/te/test_te_real.py checks).
PIP = {
    "1.9.0": "1.9.0.post1",
    "1.13.0": "1.13.0",
    "2.1.0": "2.1.0",
    "2.4.0": "2.4.0",
    "2.8.0": "2.8.0",
    "2.9.0": "2.9.0",
    "2.10.0": "2.10.0",
    "2.12.0": "2.12.0",
    "2.16.1": "2.16.1",
    "2.18.0": "2.18.0",
    "2.19.0": "2.19.0",
    "2.20.2": "2.20.2",
}
RELEASES = tuple(PIP)


def folder(release: str) -> Path:
    return DEPS / f"te-{release}"


def installed(release: str) -> bool:
    return (folder(release) / "transformer_engine" / "pytorch" / "__init__.py").is_file()


def key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".")[:3])


# --- what each release has (checked against the real release by tests/te/test_te_real.py) -------

MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
# The fields holding a value's bytes, by class family (harness/te_standins.py builds its stand-ins
# with these names; tests/te/test_te_real.py checks them against the real classes of every release).
FIELDS = {
    "Float8Tensor": ("_data", "_transpose", "_scale_inv"),
    "Float8BlockwiseQTensor": ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"),
}
# Keys each module's forward caches under (from its source: `cache_name=`, `_fp8_workspaces[...]`).
_KEYS = {"Linear": ["weight"], "LayerNormLinear": ["weight"], "LayerNormMLP": ["fc1_weight", "fc2_weight"]}
KEYS_1_9 = {**_KEYS, "GroupedLinear": ["weight{i}"]}
KEYS_2_19 = {**_KEYS, "GroupedLinear": ["weight", "weight{i}"]}  # "weight": single_grouped_weight=True

# What `make_graphed_callables(module)` leaves on the module (graph.py): without `_order`, and with it.
NEW_FWD = "_make_graphed_callables.<locals>.make_graphed_forward.<locals>.new_fwd"
FORWARD_FUNC = "make_graphed_callables.<locals>.wrap_autocast.<locals>.forward_func"
RESET = "_make_graphed_callables.<locals>.make_graphed_attribute_functions.<locals>.reset"
BACKWARD_DW = "_make_graphed_callables.<locals>.make_graphed_attribute_functions.<locals>.backward_dw"
MARKS_1_9 = {"plain": {"forward": NEW_FWD}, "order": {"forward": FORWARD_FUNC}}
MARKS_2_8 = {"plain": {"forward": NEW_FWD}, "order": {}}
MARKS_2_10 = {"plain": {"forward": NEW_FWD, "reset": RESET, "backward_dw": BACKWARD_DW}, "order": {}}

_F8_BASE = ("Float8Tensor", "Float8TensorBase", "MXFP8Tensor", "MXFP8TensorBase")
_BLOCK_BASE = ("Float8BlockwiseQTensor", "Float8BlockwiseQTensorBase", "DebugQuantizedTensor")
_NVFP4_BASE = ("NVFP4Tensor", "NVFP4TensorBase")
_STORAGE = (
    "Float8Tensor",
    "Float8TensorStorage",
    "MXFP8Tensor",
    "MXFP8TensorStorage",
    "Float8BlockwiseQTensor",
    "Float8BlockwiseQTensorStorage",
    "NVFP4Tensor",
    "NVFP4TensorStorage",
    "DebugQuantizedTensor",
)
_GROUPED = ("GroupedTensor", "GroupedTensorStorage")
_HYBRID = ("IdentityTensor", "IdentityTensorStorage", "HybridQuantizedTensor", "HybridQuantizedTensorStorage")


def _release(method: str, classes: tuple[str, ...], keys: dict, marks: dict) -> dict:
    return {"workspace_method": method, "classes": classes, "keys": keys, "graph_marks": marks}


# classes: the value classes the release defines (tensor classes and their base / storage class);
# every one of them can be a cache value except GroupedTensor* before 2.19 (GroupedLinear caches one
# only with single_grouped_weight, 2.19+: the "weight" key). workspace_method: what fills the cache.
BOUNDARIES: dict[str, dict] = {
    "1.9.0": _release("get_fp8_workspace", ("Float8Tensor",), KEYS_1_9, MARKS_1_9),
    "1.13.0": _release("get_fp8_workspace", ("Float8Tensor",), KEYS_1_9, MARKS_1_9),
    "2.1.0": _release("get_weight_workspace", _F8_BASE, KEYS_1_9, MARKS_1_9),
    "2.4.0": _release("get_weight_workspace", _F8_BASE + _BLOCK_BASE, KEYS_1_9, MARKS_1_9),
    "2.8.0": _release("get_weight_workspace", _F8_BASE + _BLOCK_BASE + _NVFP4_BASE, KEYS_1_9, MARKS_2_8),
    "2.9.0": _release("get_weight_workspace", _STORAGE, KEYS_1_9, MARKS_2_8),
    "2.10.0": _release("get_weight_workspace", _STORAGE, KEYS_1_9, MARKS_2_10),
    "2.12.0": _release("get_weight_workspace", _STORAGE, KEYS_1_9, MARKS_2_10),
    "2.16.1": _release("quantize_weight", _STORAGE + _GROUPED, KEYS_1_9, MARKS_2_10),
    "2.18.0": _release("quantize_weight", _STORAGE + _GROUPED, KEYS_1_9, MARKS_2_10),
    "2.19.0": _release("quantize_weight", _STORAGE + _GROUPED + _HYBRID, KEYS_2_19, MARKS_2_10),
    "2.20.2": _release("quantize_weight", _STORAGE + _GROUPED + _HYBRID, KEYS_2_19, MARKS_2_10),
}

# Classes TE's own constructor cannot build on a CPU-only torch, and the error it raises there:
# 1.x `Float8Tensor.__new__` moves its data with `.cuda()`; 2.x `QuantizedTensor.__new__` puts the
# wrapper on `torch.cuda.current_device()` until 2.10 adds a `device` argument. Their base /
# storage classes hold the same fields and are built instead.
_NO_CUDA = "Torch not compiled with CUDA enabled"
NOT_BUILDABLE: dict[str, dict[str, str]] = {
    name: {r: _NO_CUDA for r in RELEASES if key(r) < (2, 10) and name in BOUNDARIES[r]["classes"]}
    for name in ("Float8Tensor", "MXFP8Tensor", "Float8BlockwiseQTensor", "NVFP4Tensor")
}


def cached(release: str) -> tuple[str, ...]:
    classes = BOUNDARIES[release]["classes"]
    return tuple(c for c in classes if not (c.startswith("Grouped") and key(release) < (2, 19)))


def markdown() -> str:
    """The table of TE releases in docs/te-releases.md (embedded there verbatim; a test compares)."""
    rows = [
        "| TE release (wheel tested) | cache filled by | value classes cached (tensor / base or storage) "
        "| cache keys | `make_graphed_callables` marks on the module |",
        "|---|---|---|---|---|",
    ]
    for release in RELEASES:
        data = BOUNDARIES[release]
        tensors = [c for c in cached(release) if not c.endswith(("Base", "Storage"))]
        shown = ", ".join(
            f"`{c}`" + (" (+ base/storage)" if any(o.startswith(c) and o != c for o in data["classes"]) else "")
            for c in tensors
        )
        grouped = data["keys"]["GroupedLinear"]
        keys = "`weight`, `fc1_weight`/`fc2_weight`, " + " / ".join(f"`{k}`" for k in grouped)
        marks = data["graph_marks"]
        plain = ", ".join(f"`{k}`" for k in marks["plain"])
        order = ", ".join(f"`{k}`" for k in marks["order"]) or "none"
        rows.append(
            f"| {PIP[release]} | `{data['workspace_method']}` | {shown} | {keys} | {plain}; with `_order`: {order} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
