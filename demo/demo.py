"""The shim's main job, as a newcomer sees it.

Runs verl's real `offload_megatron_model_to_cpu` (verl 0.8.0, no upstream fix) on a real
megatron-core GPTModel in megatron DDP whose linears carry FP8 weight caches in Transformer Engine's
>= 1.8 layout (TE itself needs CUDA to install, so on a CPU machine the caches are stand-ins: real
tensors in TE's layout, see harness/te_standins.py). Each case runs in a fresh interpreter: once
without the shim, once with `import te_offload_shim` first. It prints what stays resident.

On a machine with CUDA the model and caches live on the GPU and the device memory is reported as
the allocator and the driver see it (allocated, reserved, free).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3


def one_case(shim: bool, layers: int, hidden: int) -> dict:
    if shim:
        import te_offload_shim  # noqa: F401  - what a user adds: the whole fix

    from harness import megatron_world as w

    model = w.wrap_ddp(w.build_gpt(layers=layers, hidden=hidden, vocab=256))
    w.attach_fp8_caches(model)
    cuda = w.on_gpu()

    before = {"caches": w.cache_state([model]), **w.device_memory()}
    from verl.workers.engine.megatron import transformer_impl  # verl's caller, as verl imports it

    resident_before = _resident([model], cuda)
    transformer_impl.offload_megatron_model_to_cpu([model])
    after = {"caches": w.cache_state([model]), **w.device_memory()}
    resident = {"before": resident_before, "after": _resident([model], cuda)}
    return {"shim": shim, "device": "cuda" if cuda else "cpu", "before": before, "after": after, "resident": resident}


def _resident(models: list, cuda: bool) -> dict:
    """What the model holds on the device, by category. Without the shim this case runs with
    TE_OFFLOAD_SHIM=0, so importing the package for its report installs nothing. On a CPU machine
    "the device" is the host: the offload frees the DDP buffers' storages, what stays is what a GPU keeps."""
    import te_offload_shim

    return te_offload_shim.residue(models, device_type=None if cuda else "cpu").by_category


def fmt(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:8.3f} GiB" if n >= GIB else f"{n / 1024**2:8.2f} MiB"


def print_resident(results: list[dict]) -> None:
    """`te_offload_shim.residue` before and after each offload: every category the model holds there."""
    rows = [("before the offload", results[0]["resident"]["before"])]
    rows += [(f"after, {'with' if r['shim'] else 'without'} the shim", r["resident"]["after"]) for r in results]
    names = [n for n in rows[0][1] if any(row[n] for _, row in rows)]
    print(f"Resident on the {results[0]['device']} by category (te_offload_shim.residue):")
    print(f"{'':<26}" + "".join(f"{n:>16}" for n in [*names, "total"]))
    for label, row in rows:
        print(f"{label:<26}" + "".join(f"{fmt(row[n]):>16}" for n in names) + f"{fmt(sum(row.values())):>16}")


def _count(low: int, multiple: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or value % multiple:
            extra = f" and a multiple of {multiple}" if multiple > 1 else ""
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}{extra}")
        return value

    return parse


def main() -> int:
    installed = sorted(p.name.removeprefix("verl-") for p in (REPO / ".deps").glob("verl-*") if (p / "verl").is_dir())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=_count(1), default=4, help="transformer layers (default 4)")
    parser.add_argument("--hidden", type=_count(8, 4), default=512, help="hidden size, 4 attention heads (default 512)")
    parser.add_argument("--verl", default="0.8.0", help=f"verl release, one of {', '.join(installed) or 'none'}")
    parser.add_argument("--case", choices=["with", "without"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.verl not in installed:
        parser.error(f"verl {args.verl} is not set up here (scripts/setup-env.sh installs {', '.join(installed)})")

    if args.case:
        import warnings

        warnings.filterwarnings("ignore")
        print("RESULT " + json.dumps(one_case(args.case == "with", args.layers, args.hidden)))
        return 0

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / ".deps" / f"verl-{args.verl}")]))
    env.pop("TE_OFFLOAD_SHIM", None)
    results = []
    for case in ("without", "with"):
        cmd = [sys.executable, __file__, "--case", case, "--layers", str(args.layers), "--hidden", str(args.hidden)]
        case_env = dict(env, TE_OFFLOAD_SHIM="0") if case == "without" else env
        proc = subprocess.run(cmd, capture_output=True, text=True, env=case_env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        results.append(json.loads(lines[-1][7:]))

    device = results[0]["device"]
    print(
        f"verl {args.verl} offload_megatron_model_to_cpu on a megatron-core GPTModel ({args.layers} layers, "
        f"hidden {args.hidden}) in megatron DDP, FP8 caches in TE >= 1.8 layout, device: {device}"
    )
    if device == "cpu":
        print("(CPU: the caches are stand-ins in TE's layout, holding real bytes; run on CUDA for device memory)")
    print()
    header = f"{'':<22}{'FP8 caches before':>20}{'after offload':>16}{'bytes after':>16}"
    if device == "cuda":
        header += f"{'allocated after':>18}{'reserved after':>17}{'driver free after':>20}"
    print(header)
    for r in results:
        row = (
            f"{'with the shim' if r['shim'] else 'without the shim':<22}{r['before']['caches']['entries']:>20}"
            f"{r['after']['caches']['entries']:>16}{fmt(r['after']['caches']['bytes']):>16}"
        )
        if device == "cuda":
            row += f"{fmt(r['after']['allocated']):>18}{fmt(r['after']['reserved']):>17}{fmt(r['after']['free']):>20}"
        print(row)
    without, with_ = results
    print()
    print_resident(results)
    print()
    print(
        f"Left resident without the shim: {without['after']['caches']['entries']} cached FP8 weights, "
        f"{fmt(without['after']['caches']['bytes']).strip()}; with it: {with_['after']['caches']['entries']}, "
        f"{fmt(with_['after']['caches']['bytes']).strip()}."
    )
    if without["after"]["caches"]["entries"] == 0:
        # verl 0.9.0+ clears its own caches: the shim steps aside, and both rows are clean.
        print(f"verl {args.verl} clears the caches itself (fixed upstream): the shim stays out of its way.")
    return 0 if with_["after"]["caches"]["entries"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
