"""The shim's main job, as a newcomer sees it.

Runs verl's real `offload_megatron_model_to_cpu` (verl 0.8.0, no upstream fix) on a real
megatron-core GPTModel in megatron DDP, once without the shim and once with `import te_offload_shim`
first, each in a fresh interpreter, and prints the FP8 weight caches that stay resident. A third
run shows the flush net: the same function loaded under another module name, as a fork's copy is
(`fork_of_verl.megatron_utils`), which no row of the target table watches; the shim's net clears
the caches at the copy's own `torch.cuda.empty_cache()` and logs who called it.

On a CPU machine the model is built from Transformer Engine's own layers
(`get_gpt_layer_with_transformer_engine_spec()`), TE's Python from its PyPI wheel running on a CPU
twin of its compiled extension (harness/te_twin): the caches are the ones TE's forward made, with
their real bytes. Each run trains a step (2 microbatches, FP8 delayed scaling), offloads with verl,
loads back, trains another step; the demo shows whether the two runs' losses are bit-identical.

Stand-ins (harness/te_standins.py: real tensors in TE's layout, attached to megatron's own linears,
no training) remain only where TE cannot run: on a CUDA machine (the twin answers for CUDA inside its
process, so it cannot share one with a real GPU; the model, the stand-ins and the memory figures
are then on the GPU), or when TE's wheel cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
STEP_LOSSES = 2  # microbatches per step
CASES = ("without", "with", "net")
LABELS = {"without": "without the shim", "with": "with the shim", "net": "a fork's copy (net)"}
FORK = "fork_of_verl.megatron_utils"  # the module name the net case loads verl's file under


def one_case(case: str, layers: int, hidden: int, te: str, forced: str | None = None) -> dict:
    shim = case != "without"
    if shim:
        import te_offload_shim  # noqa: F401  - what a user adds: the whole fix
    lines = _net_lines() if case == "net" else []
    result = _run_case(case, shim, layers, hidden, te, forced)
    return {**result, "mode": case, "net_lines": lines}


def _run_case(case: str, shim: bool, layers: int, hidden: int, te: str, forced: str | None) -> dict:
    from harness import demo_mode  # which TE this machine runs (its choice is unit-tested)

    mode = demo_mode.choose(demo_mode.facts(te), forced)
    print("MODE " + json.dumps({"name": mode.name, "why": mode.why}), flush=True)  # the parent's first line
    if mode.name == "te":
        return _te_case(shim, layers, hidden) | {"mode_why": mode.why}
    if mode.name == "standins":
        return _standin_case(shim, layers, hidden, mode.why) | {"mode_why": mode.why}
    from harness import gpt_on_twin

    gpt_on_twin.load(te)
    return _twin_case(case, shim, layers, hidden, te) | {"mode_why": mode.why}


def _te_case(shim: bool, layers: int, hidden: int) -> dict:
    """TE's real kernels on the GPU (no twin, no stand-ins): a step, verl's offload and reload,
    another step; the driver-visible memory before and after the offload."""
    import torch
    import transformer_engine

    from harness import gpt_on_twin as gpt
    from harness import megatron_world as w

    ddp = gpt.build("hybrid", layers=layers, hidden=hidden, cuda=True)
    losses = gpt.train_step(ddp, 0, device="cuda")
    from verl.utils import megatron_utils
    from verl.workers.engine.megatron import transformer_impl  # verl's caller, as verl imports it

    before = {"caches": gpt.cache_state([ddp]), **w.device_memory()}
    resident_before = _resident([ddp], cuda=True)
    transformer_impl.offload_megatron_model_to_cpu([ddp])
    after = {"caches": gpt.cache_state([ddp]), **w.device_memory()}
    resident = {"before": resident_before, "after": _resident([ddp], cuda=True)}
    megatron_utils.load_megatron_model_to_gpu([ddp])
    losses += gpt.train_step(ddp, 1, device="cuda")
    return {
        "shim": shim,
        "backend": "te",
        "te": transformer_engine.__version__,
        "device": "cuda",
        "gpu": torch.cuda.get_device_name(),
        "before": before,
        "after": after,
        "resident": resident,
        "losses": [float(loss) for loss in losses],
        "loss_bits": [int(loss.float().view(torch.int32).item()) for loss in losses],
    }


def _net_lines() -> list[str]:
    """The shim's log lines about the net, collected for the report (the first net clearing logs
    one line at the level of the first-clearing line)."""
    import logging

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "the target table does not know" in record.getMessage():
                lines.append(record.getMessage())

    logging.getLogger("te_offload_shim").addHandler(Collect())
    return lines


def _fork_copy() -> object:
    """verl's own file, imported under another module name: a fork's copy of the function."""
    import verl

    from harness.fork_copy import load_as

    return load_as(Path(verl.__file__).parent / "utils" / "megatron_utils.py", FORK)


def _twin_case(mode: str, shim: bool, layers: int, hidden: int, te: str) -> dict:
    """TE's own modules on the twin: a step, verl's offload and reload, another step."""
    import torch

    from harness import gpt_on_twin as gpt

    ddp = gpt.build("hybrid", layers=layers, hidden=hidden)
    losses = gpt.train_step(ddp, 0)
    before = {"caches": gpt.cache_state([ddp])}
    if mode == "net":
        fork: Any = _fork_copy()
        offload, reload = fork.offload_megatron_model_to_cpu, fork.load_megatron_model_to_gpu
    else:
        from verl.utils import megatron_utils
        from verl.workers.engine.megatron import transformer_impl  # verl's caller, as verl imports it

        offload, reload = transformer_impl.offload_megatron_model_to_cpu, megatron_utils.load_megatron_model_to_gpu

    resident_before = _resident([ddp], cuda=False)
    offload([ddp])
    after = {"caches": gpt.cache_state([ddp])}
    resident = {"before": resident_before, "after": _resident([ddp], cuda=False)}
    reload([ddp])
    losses += gpt.train_step(ddp, 1)
    return {
        "shim": shim,
        "backend": "twin",
        "te": te,
        "device": "cpu",
        "before": before,
        "after": after,
        "resident": resident,
        "losses": [float(loss) for loss in losses],
        "loss_bits": [int(loss.float().view(torch.int32).item()) for loss in losses],
    }


def _standin_case(shim: bool, layers: int, hidden: int, why: str) -> dict:
    """megatron's local layer spec with TE-layout stand-in caches on its linears; no training."""
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
    return {
        "shim": shim,
        "backend": "standins",
        "why": why,
        "device": "cuda" if cuda else "cpu",
        "before": before,
        "after": after,
        "resident": resident,
    }


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
    rows += [(f"after, {LABELS[r['mode']]}", r["resident"]["after"]) for r in results]
    names = [n for n in rows[0][1] if any(row[n] for _, row in rows)]
    print(f"Resident on the {results[0]['device']} by category (te_offload_shim.residue):")
    print(f"{'':<31}" + "".join(f"{n:>16}" for n in [*names, "total"]))
    for label, row in rows:
        print(f"{label:<31}" + "".join(f"{fmt(row[n]):>16}" for n in names) + f"{fmt(sum(row.values())):>16}")


def print_losses(results: list[dict]) -> bool:
    """Each run's losses (step 1, then step 2 after the offload and reload); True when bit-identical."""
    print("Losses, step 1 | step 2 after the offload and reload (2 microbatches each):")
    for r in results:
        values = [f"{v:.7f}" for v in r["losses"]]
        print(f"  {LABELS[r['mode']]:<22}" + " ".join(values[:STEP_LOSSES]) + " | " + " ".join(values[STEP_LOSSES:]))
    without = results[0]
    same = all(r["loss_bits"] == without["loss_bits"] for r in results)
    n = len(without["loss_bits"])
    verdict = f"bit-identical ({n} of {n})" if same else "DIFFERENT"
    print(f"In the {len(results)} runs the losses are {verdict}.")
    return same


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
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # run as a script: its own folder is on the path, not the repository
    from harness.gpt_on_twin import RELEASES

    installed = sorted(p.name.removeprefix("verl-") for p in (REPO / ".deps").glob("verl-*") if (p / "verl").is_dir())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=_count(1), default=4, help="transformer layers (default 4)")
    # TE's FP8 GEMMs take dimensions that are multiples of 16 (assert_dim_for_fp8_exec)
    hidden_help = "hidden size, a multiple of 16, 4 attention heads (default 512)"
    parser.add_argument("--hidden", type=_count(16, 16), default=512, help=hidden_help)
    parser.add_argument("--verl", default="0.8.0", help=f"verl release, one of {', '.join(installed) or 'none'}")
    parser.add_argument("--te", default=RELEASES[0], help=f"TE release on the CPU twin, one of {', '.join(RELEASES)}")
    parser.add_argument(
        "--mode", choices=["te", "twin", "standins"], help="require this mode or fail (harness/demo_mode.py)"
    )
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.verl not in installed:
        parser.error(f"verl {args.verl} is not set up here (scripts/setup-env.sh installs {', '.join(installed)})")
    if args.te not in RELEASES:
        parser.error(f"TE {args.te} does not run on the twin (one of {', '.join(RELEASES)})")

    if args.case:
        import warnings

        warnings.filterwarnings("ignore")
        result = one_case(args.case, args.layers, args.hidden, args.te, args.mode)
        print("RESULT " + json.dumps(result))
        return 0

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / ".deps" / f"verl-{args.verl}")]))
    env.pop("TE_OFFLOAD_SHIM", None)
    procs = []
    for case in CASES:  # three fresh interpreters, side by side (most of each is imports)
        cmd = [sys.executable, __file__, "--case", case, "--layers", str(args.layers), "--hidden", str(args.hidden)]
        cmd += ["--te", args.te] + (["--mode", args.mode] if args.mode else [])
        case_env = dict(env, TE_OFFLOAD_SHIM="0") if case == "without" else env
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=case_env))
    # The mode line as soon as the first case has chosen it (seconds, where the cases take most of a
    # minute): a newcomer sees what runs before the figures come.
    assert procs[0].stdout is not None
    first = procs[0].stdout.readline()
    chosen = json.loads(first[5:]) if first.startswith("MODE ") else None
    if chosen is not None:
        print(f"mode: {chosen['name']} ({chosen['why']})", flush=True)
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(stdout, stderr, file=sys.stderr)
            return 1
        results.append(json.loads(lines[-1][7:]))
    if chosen is not None and {r["backend"] for r in results} != {chosen["name"]}:
        print(f"the cases ran {sorted({r['backend'] for r in results})}, not the mode printed", file=sys.stderr)
        return 1
    return report(results, args, mode_printed=chosen is not None)


def report(results: list[dict], args: argparse.Namespace, mode_printed: bool = False) -> int:
    without, with_, net = results
    device, twin, real = without["device"], without["backend"] == "twin", without["backend"] == "te"
    if not mode_printed:
        print(f"mode: {without['backend']} ({without.get('mode_why', '')})")
    print(
        f"verl {args.verl} offload_megatron_model_to_cpu on a megatron-core GPTModel ({args.layers} layers, "
        f"hidden {args.hidden}) in megatron DDP, device: {device}"
    )
    if real:
        print(
            f"Layers from TE's layer spec: Transformer Engine {without['te']} with its compiled extension, TE's real "
            f"kernels on {without['gpu']} (no twin, no stand-ins);\nthe FP8 caches are the ones TE's forward made "
            "(FP8 delayed scaling). Each run: a training step, the offload, the reload, another step."
        )
    elif twin:
        print(
            f"Layers from TE's layer spec: Transformer Engine {without['te']}'s own modules (its PyPI wheel) on a CPU "
            "twin of its compiled extension;\nthe FP8 caches are the ones TE's forward made (FP8 delayed scaling). "
            "Each run: a training step, the offload, the reload, another step.\n"
            f"The third run offloads with verl's function loaded as module {FORK} (a fork's copy: no row of the "
            "target table watches it);\nonly the shim's flush net sees it, at the copy's torch.cuda.empty_cache()."
        )
    else:
        print(f"(stand-ins: {without['why']}; the caches are stand-ins in TE's layout holding real bytes, no training)")
    print()
    header = f"{'':<24}{'FP8 caches before':>18}{'after offload':>16}{'bytes after':>16}"
    if device == "cuda":
        header += f"{'allocated after':>18}{'reserved after':>17}{'driver free after':>20}"
    print(header)
    for r in results:
        row = (
            f"{LABELS[r['mode']]:<24}{r['before']['caches']['entries']:>18}"
            f"{r['after']['caches']['entries']:>16}{fmt(r['after']['caches']['bytes']):>16}"
        )
        if device == "cuda":
            row += f"{fmt(r['after']['allocated']):>18}{fmt(r['after']['reserved']):>17}{fmt(r['after']['free']):>20}"
        print(row)
    print()
    print_resident(results)
    print()
    if device == "cuda":
        for r in results:
            label = "with the shim" if r["shim"] else "without the shim"
            print(
                f"Driver-visible free memory (torch.cuda.mem_get_info), {label}: {fmt(r['before']['free']).strip()} "
                f"before the offload, {fmt(r['after']['free']).strip()} after"
            )
        print()
    same = print_losses(results) if twin or real else True
    if twin or real:
        print()
    for line in net["net_lines"][:1]:
        print(f"The net's log line:\n  {line}\n")
    print(
        f"Left resident without the shim: {without['after']['caches']['entries']} cached FP8 weights, "
        f"{fmt(without['after']['caches']['bytes']).strip()}; with it: {with_['after']['caches']['entries']}, "
        f"{fmt(with_['after']['caches']['bytes']).strip()}; by the fork's copy, the net on: "
        f"{net['after']['caches']['entries']}."
    )
    if without["after"]["caches"]["entries"] == 0:
        # verl 0.9.0+ clears its own caches: the shim steps aside, and both rows are clean.
        print(f"verl {args.verl} clears the caches itself (fixed upstream): the shim stays out of its way.")
    if not twin:
        print("(the net needs TE's own modules: with stand-ins the third run is verl's own offload with the shim)")
    netted = net["after"]["caches"]["entries"] == 0 or not twin
    return 0 if with_["after"]["caches"]["entries"] == 0 and netted and same else 1


if __name__ == "__main__":
    sys.exit(main())
