"""Per-offload overhead: verl 0.8.0's real `offload_megatron_model_to_cpu` on a real megatron-core
GPTModel in megatron DDP (harness/megatron_world.py), without the shim against with it.

One process, A/B alternated: the shim is installed before verl is imported, so
`verl.utils.megatron_utils.offload_megatron_model_to_cpu` is our wrapper; "without" calls the
function it wraps (`wrapper.__wrapped__`, verl's own code), "with" calls the wrapper. Before every
timed call, untimed, the model is reloaded with verl's `load_megatron_model_to_gpu` and its
TE-layout FP8 caches (stand-ins holding real float8 bytes) are refilled, so both sides do the same
offload work except the clearing. The offload includes verl's own `gc.collect()` and flush.

On CPU the offload is a host memcpy, much cheaper than the device-to-host copy of a GPU run, so
the shim's share printed here is an upper bound of its share on a GPU.

    .venv/bin/python benchmarks/offload_overhead.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ab, main, row, use_repo

use_repo(verl="0.8.0")

import te_offload_shim  # noqa: E402  (installed before verl is imported, as in a real run)

CONFIGS = {"full": {"layers": 8, "hidden": 512, "repeats": 21}, "quick": {"layers": 2, "hidden": 64, "repeats": 3}}


def measure(layers: int, hidden: int, repeats: int) -> dict[str, Any]:
    from harness import megatron_world as w
    from te_offload_shim.engine.patch import shim_layers

    model = w.wrap_ddp(w.build_gpt(layers=layers, hidden=hidden, vocab=1024))
    entries = w.attach_fp8_caches(model)
    initial = w.cache_state([model])
    refills = [(ws, dict(ws)) for m in model.modules() if (ws := m.__dict__.get("_fp8_workspaces")) is not None]

    from verl.utils import megatron_utils as mu

    wrapper = mu.offload_megatron_model_to_cpu
    if shim_layers(wrapper) != 1:
        raise SystemExit(f"expected verl's offload to be wrapped once, found {shim_layers(wrapper)} layers")
    original = wrapper.__wrapped__
    models = [model]
    left: dict[str, list[int]] = {"ours": [], "reference": []}

    def prepare() -> None:
        mu.load_megatron_model_to_gpu(models)
        for ws, saved in refills:
            ws.update(saved)

    def check(side: str, _: Any) -> None:
        if not all(b.param_data.untyped_storage().size() == 0 for b in model.buffers):
            raise AssertionError(f"{side}: the parameters were not offloaded")
        left[side].append(w.cache_state(models)["entries"])

    figures = ab(lambda: wrapper(models), lambda: original(models), repeats, prepare, check)
    isolated = _shim_alone(models, original, refills, repeats)
    params = sum(p.numel() for p in model.parameters())
    overhead = figures["ours_s"] - figures["reference_s"]
    return {
        "layers": layers,
        "hidden": hidden,
        "params": params,
        "cache_entries": entries,
        "cache_bytes": initial["bytes"],
        "entries_left": {side: sorted(set(v)) for side, v in left.items()},
        "shim_stats": te_offload_shim.stats(),
        "overhead_ms": overhead * 1e3,
        "shim_share": overhead / figures["ours_s"] if figures["ours_s"] > 0 else None,
        "shim_alone_ms": isolated * 1e3,
        "shim_alone_share": isolated / figures["ours_s"] if figures["ours_s"] > 0 else None,
        **figures,
    }


def _shim_alone(models: list[Any], original: Any, refills: list[tuple[dict, dict]], repeats: int) -> float:
    """Median seconds of the wrapper's own handler (bind, locate, clear, count, log) around a no-op.

    The A/B difference above sits inside verl's `gc.collect()`, whose time varies by more than the
    shim costs; this isolates what the shim adds to each call."""
    import inspect
    import statistics

    from _common import timed

    from te_offload_shim.engine.handler import Handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations.targets import BUILTIN

    target = next(t for t in BUILTIN if t.name == "verl")
    record = Record("target", None, target.attribute, original, target=target.name)
    handler = Handler(target, inspect.signature(original), "function", record)
    samples = []
    for _ in range(max(repeats, 5)):
        for ws, saved in refills:
            ws.update(saved)
        samples.append(timed(lambda: handler(lambda *_: None, None, (models,), {}))[0])
    return statistics.median(samples)


def run(quick: bool = False) -> dict[str, Any]:
    config = CONFIGS["quick" if quick else "full"]
    m = measure(**config)
    share = m["shim_share"]
    note = (
        f"verl 0.8.0 offload with shim vs without (A/B difference {m['overhead_ms']:.2f} ms, "
        f"{share * 100:.1f}%; clears {m['cache_entries']} entries)"
    )
    case = f"GPTModel+DDP {m['layers']}x{m['hidden']}, {m['params'] / 1e6:.1f}M params"
    alone = {"ours_s": m["shim_alone_ms"] / 1e3, "reference_s": m["reference_s"], "ratio": m["shim_alone_share"]}
    alone["repeats"] = max(m["repeats"], 5)
    rows = [
        row("per-offload", case, m, note=note),
        row(
            "per-offload",
            "shim's own work per call",
            alone,
            note="the wrapper's handler around a no-op vs verl's offload: ratio = the shim's share",
        ),
    ]
    return {"benchmark": "offload_overhead", "quick": quick, "rows": rows, **m}


if __name__ == "__main__":
    main(run, __doc__, "a tiny model, few repeats (tests)")
