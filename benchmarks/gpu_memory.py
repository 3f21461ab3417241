"""The GPU memory proof: verl 0.8.0's real `offload_megatron_model_to_cpu` on a real megatron-core
GPTModel (megatron DDP) on the GPU, whose linears hold TE FP8 weight caches, without the shim and
with it, each case in a fresh interpreter.

Per case: allocated and reserved (PyTorch's allocator) and free (the driver, `torch.cuda.mem_get_info`)
before and after the offload, plus the cache entries and bytes. Expected: without the shim the cache
bytes stay allocated after verl's own flush; with it, the driver gets them back.

Caches: real TE ones when `transformer_engine.pytorch` imports (TE layer spec, one FP8 forward fills
`_fp8_workspaces`); otherwise TE >= 1.8 layout stand-ins (harness/te_standins.py `Float8TensorV2`:
`_data` and `_transpose` hold real `torch.float8_e4m3fn` bytes, one byte per weight element each).
The output says which.

    python benchmarks/gpu_memory.py                 # on a CUDA machine (see BENCHMARKS.md to prepare it)
    python benchmarks/gpu_memory.py --dry-run       # same code path on CPU; memory figures are n/a

Exit status 0 when the figures show what is expected, 1 when they do not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, Parser, emit, output_file, parse_result, positive_int, quiet_env

MiB = 1 << 20
SIZES = {"full": {"layers": 4, "hidden": 2048}, "dry": {"layers": 2, "hidden": 64}}


# --- one case, in its own interpreter -----------------------------------------------------------


def _te_caches(layers: int, hidden: int) -> tuple[Any, str]:
    """A GPTModel with TE's layer spec and FP8 on, one forward so TE fills its workspaces."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer import TransformerConfig

    from harness import megatron_world as w

    w.init_world()
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=16,
        bf16=True,
        params_dtype=torch.bfloat16,
        fp8="hybrid",
    )
    model = GPTModel(cfg, get_gpt_layer_with_transformer_engine_spec(), vocab_size=1024, max_sequence_length=128)
    model = w.wrap_ddp(model.cuda())
    tokens = torch.randint(0, 1024, (2, 128), device="cuda")
    positions = torch.arange(128, device="cuda").unsqueeze(0).expand(2, -1)
    model(tokens, positions, None).float().sum().backward()
    torch.cuda.synchronize()
    import transformer_engine

    return model, f"Transformer Engine {transformer_engine.__version__} (real FP8 forward, fp8='hybrid')"


def _standin_caches(layers: int, hidden: int) -> tuple[Any, str]:
    from harness import megatron_world as w
    from harness.te_standins import Float8TensorV2

    model = w.wrap_ddp(w.build_gpt(layers=layers, hidden=hidden, vocab=1024))
    w.attach_fp8_caches(model, Float8TensorV2)
    return model, "TE >= 1.8 layout stand-ins (Float8TensorV2: _data + _transpose in torch.float8_e4m3fn bytes)"


def _cache_state(model: Any) -> dict[str, int]:
    """Entries and unique bytes held by every `_fp8_workspaces` (stand-ins or real TE values)."""
    from harness import megatron_world as w

    if os.environ.get("GPU_MEMORY_CACHES") != "te":
        return w.cache_state([model])
    # Real TE values: the shim's read-only scan counts them (TE_OFFLOAD_SHIM=0 keeps it uninstalled
    # in the "without" case; scan changes nothing).
    from te_offload_shim.te.caches import scan

    report = scan([model])
    return {"entries": report.entries, "bytes": report.bytes + report.bytes_shared}


def case(name: str, layers: int, hidden: int, dry_run: bool) -> dict[str, Any]:
    """Build, fill caches, offload with verl 0.8.0, report memory before/after."""
    if name == "with":
        import te_offload_shim  # before verl, as the .pth / VERL_USE_EXTERNAL_MODULES would do

        assert te_offload_shim.installed()
    import torch

    from harness import megatron_world as w

    on_gpu = w.on_gpu()
    if not dry_run and not on_gpu:
        raise SystemExit("no CUDA device: run with --dry-run, or on a CUDA machine")
    caches_note = None
    model = None
    if on_gpu and os.environ.get("GPU_MEMORY_CACHES", "auto") in ("auto", "te"):
        try:
            import transformer_engine.pytorch  # noqa: F401

            model, caches_note = _te_caches(layers, hidden)
            os.environ["GPU_MEMORY_CACHES"] = "te"
        except Exception as exc:  # TE missing or unusable here: stand-ins, said in the output
            caches_note = f"TE not usable ({type(exc).__name__}: {str(exc)[:120]}); "
            model = None
    if model is None:
        os.environ["GPU_MEMORY_CACHES"] = "standins"
        model, note = _standin_caches(layers, hidden)
        caches_note = (caches_note or "") + note
    from verl.utils import megatron_utils as mu

    from te_offload_shim.engine.patch import shim_layers

    wrapped = shim_layers(mu.offload_megatron_model_to_cpu)
    caches_before = _cache_state(model)
    before = w.device_memory()
    mu.offload_megatron_model_to_cpu([model])  # verl's own gc.collect() + empty_cache() inside
    after = w.device_memory()
    caches_after = _cache_state(model)
    offloaded = all(b.param_data.untyped_storage().size() == 0 for b in model.buffers)
    return {
        "case": name,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu (dry run)",
        "torch": torch.__version__,
        "ray": "stub" if "gpu_stubs" in (getattr(sys.modules.get("ray"), "__file__", "") or "") else "real",
        "caches_made_with": caches_note,
        "shim_layers": wrapped,
        "params": sum(p.numel() for p in model.parameters()),
        "params_offloaded": offloaded,
        "caches_before": caches_before,
        "caches_after": caches_after,
        "before": before,
        "after": after,
    }


# --- the driver: both cases, side by side -------------------------------------------------------


def _run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env = quiet_env()
    paths = [str(REPO), str(args.verl)]
    # The GPU machine has no ray wheel (too big to carry): verl only imports it, so a stub will do.
    if os.environ.get("GPU_MEMORY_STUB_RAY") == "1" or importlib.util.find_spec("ray") is None:
        paths.insert(0, str(Path(__file__).resolve().parent / "gpu_stubs"))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if name == "without":
        env["TE_OFFLOAD_SHIM"] = "0"  # in case the shim's .pth is installed in this environment
    if args.dry_run:
        env["HARNESS_FORCE_CPU"] = "1"
    cmd = [sys.executable, "-W", "ignore", __file__, "--case", name, "--layers", str(args.layers)]
    cmd += ["--hidden", str(args.hidden)] + (["--dry-run"] if args.dry_run else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=args.timeout)
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"case {name!r} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return result


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.1f}"


def verdict(cases: dict[str, dict[str, Any]]) -> tuple[bool, list[str]]:
    """Whether the figures show the bug without the shim and the fix with it."""
    without, with_ = cases["without"], cases["with"]
    problems = []
    if without["shim_layers"] != 0 or with_["shim_layers"] != 1:
        problems.append(f"shim layers without/with: {without['shim_layers']}/{with_['shim_layers']}, expected 0/1")
    if not (without["params_offloaded"] and with_["params_offloaded"]):
        problems.append("verl's offload did not offload the parameters")
    cache = without["caches_before"]["bytes"]
    if cache == 0 or without["caches_after"] != without["caches_before"]:
        problems.append("without the shim the caches should stay in place")
    if with_["caches_after"]["entries"] != 0:
        problems.append("with the shim no cache entry should be left")
    if without["after"]["allocated"] is not None:
        kept = without["after"]["allocated"] - with_["after"]["allocated"]
        if kept < 0.9 * cache:
            problems.append(f"allocated after offload differs by {_mib(kept)} MiB, expected about {_mib(cache)} MiB")
        got_back = with_["after"]["free"] - without["after"]["free"]
        if got_back < 0.9 * cache:
            problems.append(f"the driver got back {_mib(got_back)} MiB more with the shim, expected ~{_mib(cache)} MiB")
    return not problems, problems


def report(cases: dict[str, dict[str, Any]], markdown: bool = False) -> str:
    head = ["case", "cache entries", "cache MiB", "entries left", "alloc before", "alloc after"]
    head += ["reserved before", "reserved after", "free before", "free after"]
    lines = []
    for name in ("without", "with"):
        c = cases[name]
        lines.append(
            [
                f"{name} shim",
                str(c["caches_before"]["entries"]),
                _mib(c["caches_before"]["bytes"]),
                str(c["caches_after"]["entries"]),
                _mib(c["before"]["allocated"]),
                _mib(c["after"]["allocated"]),
                _mib(c["before"]["reserved"]),
                _mib(c["after"]["reserved"]),
                _mib(c["before"]["free"]),
                _mib(c["after"]["free"]),
            ]
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in lines])
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in lines)])


def run(dry_run: bool = False, layers: int | None = None, hidden: int | None = None) -> dict[str, Any]:
    size = SIZES["dry" if dry_run else "full"]
    args = argparse.Namespace(
        dry_run=dry_run,
        layers=layers or size["layers"],
        hidden=hidden or size["hidden"],
        verl=REPO / ".deps" / "verl-0.8.0",
        timeout=240,
    )
    cases = {name: _run_case(name, args) for name in ("without", "with")}
    ok, problems = verdict(cases)
    return {"benchmark": "gpu_memory", "dry_run": dry_run, "ok": ok, "problems": problems, "cases": cases}


def main(argv: list[str] | None = None) -> None:
    parser = Parser(__doc__)
    parser.add_argument("--dry-run", action="store_true", help="the same code path on CPU; memory figures n/a")
    full, dry = SIZES["full"], SIZES["dry"]
    parser.add_argument(
        "--layers", type=positive_int, help=f"transformer layers (default {full['layers']}, {dry['layers']} dry)"
    )
    parser.add_argument(
        "--hidden", type=positive_int, help=f"hidden size (default {full['hidden']}, {dry['hidden']} dry)"
    )
    parser.add_argument("--case", choices=("without", "with"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=output_file, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.case:  # the child: one case in this fresh interpreter
        size = SIZES["dry" if args.dry_run else "full"]
        emit(case(args.case, args.layers or size["layers"], args.hidden or size["hidden"], args.dry_run))
        return
    result = run(args.dry_run, args.layers, args.hidden)
    first = result["cases"]["without"]
    print(f"device: {first['device']}; torch {first['torch']}; {first['params'] / 1e6:.1f}M params")
    print(f"caches made with: {first['caches_made_with']}")
    print(report(result["cases"]) + "\n(MiB; free = the driver's view, torch.cuda.mem_get_info)")
    print("as expected" if result["ok"] else "NOT as expected: " + "; ".join(result["problems"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    emit(result)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
