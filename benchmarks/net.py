"""The flush net's check of a flush with nothing to clear, against verl 0.9.1's own walk
(`_clear_te_fp8_weight_workspaces`, imported from the real release) over the same model.

Frameworks flush the allocator often (between rollouts, after each offload of the optimizer, the
grads, the weights), and the net looks at every flush: when every TE layer's weights are on the
device it must find that out cheaply. Ours: what the net's wrapper does before it calls torch's
flush (`te_offload_shim.engine.net`'s per-flush check: the live TE layers from the weak registry,
each layer's own parameters asked whether they left the device), with every layer's weights on the
device, so nothing is cleared. Reference: verl 0.9's walk over the same model, which is what verl
does at each of its offloads (`model_chunk.modules()`, a `getattr` on each, the caches cleared; the
same cache values put back before each of its calls, untimed).

The model: the clearing walk's MoE-like tree (benchmarks/walk.py: 21 modules per layer, 6 of them
TE layers), with enough layers for 4,000 and 100,000 TE layers; each TE layer noted in the net's
registry as TE's base-class hook notes a layer it builds (`te.layers.note`). The TE layers are
stand-ins of TE's shape (harness/te_standins.py: 100,000 of TE's own modules would take minutes to
build on the twin): the check reads only a layer's own `_parameters`, never its class. The device
is the CPU here: the rule's seam (`te.placement.DEVICE_TYPE = "cpu"`) makes these weights "on the
device", as a GPU's are.

The same model with FP8 primary weights (`fp8_model_init` / `quantized_model_init`), in the same run
after the plain rows: every weight of every TE layer is TE 2.20.2's own `Float8Tensor` (data and
transpose, each in its own storage), made on the CPU twin of TE's extension (harness/te_twin:
loaded only for these rows, after the plain ones), as TE's FP8 model init leaves its parameters.

Also the one-off arming cost when TE was imported before the shim (its layers may exist already):
`te.layers.find_existing`, one pass over `gc.get_objects()` for instances of TE's base class, over
the heap of the 100,000-layer model; beside it, one full `gc.collect()` of the same heap (what a
collection the application runs anyway costs), as the yardstick.

Also "TE never imported": in a fresh interpreter that imports the shim and torch but not TE, the
flush stays torch's own function (the same object as `torch.cuda.memory.empty_cache`, defined in
torch/cuda/memory.py, not a wrapper): it costs nothing.

    .venv/bin/python benchmarks/net.py [--quick]
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, ab, main, quiet_env, row, use_repo

use_repo(verl="0.9.1")

from walk import build_tree  # noqa: E402

TE_PER_LAYER = 6  # in walk.py's layer: linear_qkv, linear_proj, 2 GroupedLinear, 2 shared-expert Linear
SIZES = {"full": ((4_000, 15), (100_000, 7)), "quick": ((120, 3), (600, 3))}
LABEL = "torch.cuda.empty_cache"
RELEASE = "2.20.2"  # TE's own Float8Tensor, on the twin, for the FP8-primary rows

NO_TE = """
import json, inspect, sys
import te_offload_shim, torch
flush = torch.cuda.empty_cache
print(json.dumps({
    "same_object": flush is torch.cuda.memory.empty_cache,
    "module": flush.__module__,
    "file": inspect.getsourcefile(flush).replace("\\\\", "/").split("/site-packages/")[-1],
    "wrapped": hasattr(flush, "__wrapped__"),
    "te_imported": any(m == "transformer_engine" or m.startswith("transformer_engine.") for m in sys.modules),
    "net": te_offload_shim.status()["net"]["state"],
}))
"""


def fp8_primary(te_modules: list[Any]) -> None:
    """Every weight of `te_modules` made TE's own FP8 primary weight: a `Float8Tensor` parameter with
    its own data, scale and transpose (one quantized by TE's quantizer, the others built by TE's
    constructor from copies of its fields: quantizing each one on the twin would take minutes)."""
    import torch

    from harness import te_twin

    te_twin.load(RELEASE)
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer, Float8Tensor

    quantizer = Float8Quantizer(torch.ones(1), torch.zeros(1), tex.DType.kFloat8E4M3)
    made: dict[Any, Any] = {}
    for module in te_modules:
        for name, p in list(module._parameters.items()):
            one = made.get(p.shape)
            if one is None:
                one = made[p.shape] = quantizer(p.detach())
            weight = Float8Tensor(
                shape=p.shape,
                dtype=p.dtype,
                data=one._data.clone(),
                fp8_scale_inv=one._scale_inv.clone(),
                fp8_dtype=one._fp8_dtype,
                data_transpose=one._transpose.clone(),
                quantizer=quantizer,
            )
            module._parameters[name] = torch.nn.Parameter(weight)


@contextlib.contextmanager
def _twin_mode_left(primary: bool) -> Iterator[None]:
    """For the timed calls of the FP8-primary rows, the twin's torch-function mode (which serves TE's
    "cuda" allocations from the CPU, harness/te_twin/redirect.py) is left: no process on a GPU has
    it, and it would put a Python call in each tensor method the check makes."""
    if not primary:
        yield
        return
    from harness.te_twin import redirect

    redirect.MODE.__exit__(None, None, None)
    try:
        yield
    finally:
        redirect.MODE.__enter__()


def measure(te_layers: int, repeats: int, primary: bool = False) -> dict[str, Any]:
    from verl.utils.megatron_utils import _clear_te_fp8_weight_workspaces as reference

    from te_offload_shim.engine import net, stats
    from te_offload_shim.te import layers, placement

    layers.forget_all()
    placement.DEVICE_TYPE = "cpu"  # the seam: these CPU weights are "on the device"
    modules = TE_PER_LAYER + (te_layers // TE_PER_LAYER) * 21  # walk.build_tree's count
    root, refills = build_tree(modules)
    te_modules = [m for m in root.modules() if "_fp8_workspaces" in m.__dict__]
    if primary:
        fp8_primary(te_modules)
        assert all(type(p).__name__ == "Float8Tensor" for m in te_modules for p in m.parameters())
    for module in te_modules:
        layers.note(module)
    entries = sum(len(e) for _, e in refills)
    before = stats.counts()["net"]

    def refill() -> None:
        for ws, filled in refills:
            ws.update(filled)

    def check(side: str, result: Any) -> None:
        left = sum(len(ws) for ws, _ in refills)
        if side == "ours" and left != entries:
            raise AssertionError(f"the net's check cleared {entries - left} entries of layers on the device")
        if side == "reference" and (left or result != entries):
            raise AssertionError(f"verl's walk cleared {result} of {entries} entries")

    with _twin_mode_left(primary):
        figures = ab(lambda: net._before_flush(LABEL), lambda: reference(root), repeats, refill, check)
    after = stats.counts()["net"]
    return {
        "te_layers": len(te_modules),
        "live_layers": layers.count(),
        "modules": sum(1 for _ in root.modules()),
        "entries": entries,
        "net_flushes": after["flushes"] - before["flushes"],
        "net_cleared": after["entries"] - before["entries"],
        **figures,
    }


def arming(te_layers: int, repeats: int) -> dict[str, Any]:
    import gc

    from harness import te_standins
    from te_offload_shim.te import layers

    layers.forget_all()
    root, _ = build_tree(TE_PER_LAYER + (te_layers // TE_PER_LAYER) * 21)
    bases = (te_standins.TELinearStandIn, te_standins.GroupedLinearStandIn)
    found: list[int] = []

    def search() -> None:
        layers.forget_all()
        found.append(sum(layers.find_existing(base)[0] for base in bases))

    figures = ab(search, gc.collect, repeats, collector=True)
    heap = len(gc.get_objects())
    layers.forget_all()
    del root
    return {"te_layers": found[-1], "heap_objects": heap, **figures}


def no_te() -> dict[str, Any]:
    env = quiet_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", NO_TE], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the no-TE probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict[str, Any]:
    rows, cases = [], []
    for primary in (False, True):  # the FP8-primary rows load TE on the twin: after the plain ones
        for te_layers, repeats in SIZES["quick" if quick else "full"]:
            m = measure(te_layers, repeats, primary)
            cases.append({"fp8_primary_weights": primary, **m})
            weights = "FP8 primary weights (TE's Float8Tensor), " if primary else ""
            rows.append(
                row(
                    "flush net",
                    f"nothing to clear: {weights}{m['te_layers']:,} TE layers, {m['modules']:,} modules",
                    m,
                    note="the net's check at a flush, every layer's weights on the device, vs verl 0.9.1 "
                    "_clear_te_fp8_weight_workspaces over the same model; goal <= 0.1",
                )
            )
    size, repeats = SIZES["quick" if quick else "full"][-1]
    armed = arming(size, repeats)
    cases.append(armed)
    rows.append(
        row(
            "flush net",
            f"arming after TE: {armed['te_layers']:,} TE layers in a heap of {armed['heap_objects']:,} objects",
            armed,
            note="once per process: te.layers.find_existing over gc.get_objects() (one pass per TE base class here, "
            "two stand-in classes) vs one full gc.collect() of the same heap",
        )
    )
    probe = no_te()
    own = probe["same_object"] and not probe["wrapped"] and probe["module"] == "torch.cuda.memory"
    rows.append(
        {
            "benchmark": "flush net",
            "case": "TE never imported",
            "note": f"torch.cuda.empty_cache is torch's own function: {'yes' if own else 'NO'} "
            f"(same object as torch.cuda.memory.empty_cache, {probe['file']}, no wrapper; net {probe['net']})",
        }
    )
    return {"benchmark": "net", "quick": quick, "rows": rows, "cases": cases, "no_te": probe}


if __name__ == "__main__":
    main(run, __doc__, "small trees, few repeats (tests)")
