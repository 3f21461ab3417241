"""Clearing walk: te_offload_shim's `clear_fp8_workspaces` (with its byte accounting) against verl
0.9's own `_clear_te_fp8_weight_workspaces` (PR #6952), imported from the real verl 0.9.1.

The reference does `getattr(submodule, "_fp8_workspaces", None)` for every module of
`model_chunk.modules()`; on a module that is not a TE layer that goes through
`nn.Module.__getattr__`, which raises inside. Ours reads instance dicts (te/walk.py).

Both clear the same tree: one MoE-like module tree, named like megatron-core's GPT layers with
TE's modules as stand-ins (harness/te_standins.py), refilled with the very same cache values
before every timed call, untimed. The tensors are tiny: only the walk and the bookkeeping are
measured, not the freeing of memory (which is the same for both).

Layer layout (21 modules, 6 of them TE layers, 4 + 2*E cache entries): input_layernorm;
self_attention {linear_qkv (TE Linear), core_attention {scale_mask_softmax, attention_dropout},
linear_proj (TE Linear), q_layernorm, k_layernorm}; pre_mlp_layernorm; mlp {router,
experts {linear_fc1, linear_fc2 (TE GroupedLinear, E experts each), activation_func},
shared_experts {linear_fc1, linear_fc2 (TE Linear), activation_func}}. With E=8 that is ~0.95
entries per module, the density of verl issue #6953 (2,148 entries cleared per rank of GLM-4.7).

On the MoE-like tree a third pair: our call with the cyclic collector left on (as it now is: the
clearing never switches it, issue 19) against the same call with it off for the call (what 0.4.0
did), the collector on during both timed calls.

A second tree, the worst case for the accounting (issue 11): a flat list of plain modules, each with
one parameter and one cache entry of four inner tensors. There the reference never raises (every
module has the attribute), so it pays least per entry, and ours pays four inner tensors per module.
On it, one more pair with the collector on during both timed calls, ours against the reference (the
dense worst case for the collector, issue 27: the clearing keeps no tracked object per entry, so it
sets off no collection; goal <= 6x). The same cache values are refilled before every call, so torch
has made their storages' Python objects before the timed calls (once per storage, as at the first
clearing of a real run's caches).

    .venv/bin/python benchmarks/walk.py [--quick]
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ab, main, row, use_repo

use_repo(verl="0.9.1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from harness import te_standins  # noqa: E402

DIM = 2  # tensors stay tiny: the walk is measured, not memory traffic
MODULES_PER_LAYER = 21
TOP_MODULES = 6  # root, embedding, word_embeddings, decoder, layers (ModuleList), final_layernorm, less one


class Container(nn.Module):
    """A module that only holds children (megatron's TransformerLayer, SelfAttention, MoELayer...)."""


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))


class Activation(nn.Module):
    pass


def _layer(experts: int) -> nn.Module:
    layer = Container()
    layer.input_layernorm = Norm()
    attn = layer.self_attention = Container()
    attn.linear_qkv = te_standins.TELinearStandIn(DIM, DIM)
    core = attn.core_attention = Container()
    core.scale_mask_softmax = Activation()
    core.attention_dropout = nn.Dropout(0.0)
    attn.linear_proj = te_standins.TELinearStandIn(DIM, DIM)
    attn.q_layernorm = Norm()
    attn.k_layernorm = Norm()
    layer.pre_mlp_layernorm = Norm()
    mlp = layer.mlp = Container()
    mlp.router = Norm()
    grouped = mlp.experts = Container()
    grouped.linear_fc1 = te_standins.GroupedLinearStandIn(experts, DIM, DIM)
    grouped.linear_fc2 = te_standins.GroupedLinearStandIn(experts, DIM, DIM)
    grouped.activation_func = Activation()
    shared = mlp.shared_experts = Container()
    shared.linear_fc1 = te_standins.TELinearStandIn(DIM, DIM)
    shared.linear_fc2 = te_standins.TELinearStandIn(DIM, DIM)
    shared.activation_func = Activation()
    return layer


def build_tree(modules: int, experts: int = 8, value_class: Any = None) -> tuple[nn.Module, list[tuple[dict, dict]]]:
    """An MoE-like tree of about `modules` modules, its caches filled as a TE forward would.

    Returns the root and, for every TE layer, (its workspace dict, the entries to refill it with)."""
    value_class = value_class or te_standins.Float8BlockwiseQTensorV2
    root = Container()
    root.embedding = Container()
    root.embedding.word_embeddings = Norm()
    root.decoder = Container()
    count = max(1, (modules - TOP_MODULES) // MODULES_PER_LAYER)
    root.decoder.layers = nn.ModuleList(_layer(experts) for _ in range(count))
    root.decoder.final_layernorm = Norm()
    root.output_layer = Norm()
    refills = []
    for module in root.modules():
        if "_fp8_workspaces" in module.__dict__:
            te_standins.fill_like_forward(module, value_class)
            ws = module.__dict__["_fp8_workspaces"]
            refills.append((ws, dict(ws)))
    return root, refills


class Plain(nn.Module):
    """A plain module holding one blockwise-like cache entry, as a TE layer's forward leaves it."""

    def __init__(self, value_class: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM, DIM))
        self.__dict__["_fp8_workspaces"] = {"weight": value_class(self.weight)}


def build_flat(modules: int, value_class: Any = None) -> tuple[nn.Module, list[tuple[dict, dict]]]:
    """`modules` modules: a root, a ModuleList, and plain modules with one entry each."""
    value_class = value_class or te_standins.Float8BlockwiseQTensorV2
    root = Container()
    root.layers = nn.ModuleList(Plain(value_class) for _ in range(max(1, modules - 2)))
    refills = [(ws, dict(ws)) for ws in (m.__dict__["_fp8_workspaces"] for m in root.layers)]
    return root, refills


TREES: dict[str, Callable[[int], tuple[nn.Module, list[tuple[dict, dict]]]]] = {"moe": build_tree, "flat": build_flat}


def measure(modules: int, repeats: int, tree: str = "moe") -> dict[str, Any]:
    from verl.utils.megatron_utils import _clear_te_fp8_weight_workspaces as reference

    from te_offload_shim.te.caches import clear_fp8_workspaces
    from te_offload_shim.te.walk import walk as _walk

    root, refills = TREES[tree](modules)
    n_modules = sum(1 for _ in root.modules())
    n_entries = sum(len(entries) for _, entries in refills)
    cleared: dict[str, list[int]] = {"ours": [], "reference": []}

    def refill() -> None:
        for ws, entries in refills:
            ws.update(entries)

    def check(side: str, result: Any) -> None:
        cleared[side].append(result if side == "reference" else result.entries)
        left = sum(len(ws) for ws, _ in refills)
        if left:
            raise AssertionError(f"{side} left {left} cache entries in place")

    # Ours exactly as the wrapper calls it: a list of chunks. The reference per chunk, as verl does.
    figures = ab(lambda: clear_fp8_workspaces([root]), lambda: reference(root), repeats, refill, check)
    # Where our time goes: the tree walk alone (te/walk.py, no accounting, no clearing).
    walk_only = ab(lambda: _walk(root), lambda: reference(root), max(3, repeats // 2), refill)
    # What leaving the collector alone costs (issue 19): the call with the collector on, as the
    # application has it, against the same call with it switched off for the call (0.4.0 did that,
    # and switched it back on behind an application that had turned it off meanwhile).
    collector = None
    if tree == "moe":
        collector = ab(lambda: clear_fp8_workspaces([root]), lambda: _collector_off(clear_fp8_workspaces, root),
                       repeats, refill, lambda side, result: check("ours", result), collector=True)  # fmt: skip
    # The dense worst case with the collector on for both sides, as an application leaves it (issue 27).
    both_on = None
    if tree == "flat":
        both_on = ab(lambda: clear_fp8_workspaces([root]), lambda: reference(root), repeats, refill, check,
                     collector=True)  # fmt: skip
    refill()
    report = clear_fp8_workspaces([root])
    return {
        "tree": tree,
        "walk_only": walk_only,
        "collector_on": collector,
        "collector_on_both": both_on,
        "modules": n_modules,
        "te_modules": len(refills),
        "entries": n_entries,
        "bytes_accounted": report.bytes,
        "cleared": {side: sorted(set(v)) for side, v in cleared.items()},
        **figures,
    }


def _collector_off(clear: Callable[[list[Any]], Any], root: nn.Module) -> Any:
    gc.disable()
    try:
        return clear([root])
    finally:
        gc.enable()


SIZES = {"full": ((10_000, 15), (100_000, 7)), "quick": ((500, 3), (2_000, 3))}


def run(quick: bool = False) -> dict[str, Any]:
    rows, cases = [], []
    for tree, label, goal in (("moe", "MoE-like", "; goal <= 1.0"), ("flat", "flat, 1 entry/module", "")):
        for modules, repeats in SIZES["quick" if quick else "full"]:
            m = measure(modules, repeats, tree)
            cases.append(m)
            rows.append(
                row(
                    "clearing walk",
                    f"{label}: {m['modules']:,} modules, {m['entries']:,} entries",
                    m,
                    note=f"ours (with byte accounting) vs verl 0.9.1 _clear_te_fp8_weight_workspaces{goal}",
                )
            )
            rows.append(
                row(
                    "clearing walk",
                    f"{label}: {m['modules']:,} modules: walk only",
                    m["walk_only"],
                    note="te/walk.py alone (no accounting, no clearing) vs the same reference",
                )
            )
            if m["collector_on"] is not None:
                rows.append(
                    row(
                        "clearing walk",
                        f"{label}: {m['modules']:,} modules: collector left on",
                        m["collector_on"],
                        note="ours with the collector on during the call vs ours with it off for the call "
                        "(0.4.0's gc.disable/enable)",
                    )
                )
            if m["collector_on_both"] is not None:
                rows.append(
                    row(
                        "clearing walk",
                        f"{label}: {m['modules']:,} modules: collector on for both",
                        m["collector_on_both"],
                        note="ours (with byte accounting) vs verl 0.9.1 _clear_te_fp8_weight_workspaces, the "
                        "collector on during both calls; goal <= 6.0",
                    )
                )
    return {"benchmark": "walk", "quick": quick, "rows": rows, "cases": cases}


if __name__ == "__main__":
    main(run, __doc__, "tiny trees, few repeats (tests)")
