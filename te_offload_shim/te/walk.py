"""The one pass over a model chunk's module tree, shared by the clearing and the residue report:
the TE layers with caches (by layout), the CUDA-graph marks on the way, the modules that could not
be read, and on request every module with its instance dict (the residue report reads them all).
A module's name for a record is te/names.py's.

Instance dicts only: `getattr(module, "_fp8_workspaces", None)` on a non-TE module goes through
`nn.Module.__getattr__` and raises inside it, and a property of a module is never run.

What the pass keeps is a few lists per call, position by position (a module in one, its dict at the
same place in the next), never a tuple per module: a tuple that lives until the call ends counts
toward the cyclic collector's next collection, and one per layer of a large model sets off many
(BENCHMARKS.md, "The clearing walk with the collector on"). `zip` over two lists reuses its tuple.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from te_offload_shim.te.graphs import TE_ONLY, GraphMarks, te_graph_mark
from te_offload_shim.te.layouts import LEGACY_MARKER, WORKSPACES


class Tree(NamedTuple):
    """What one walk over a chunk found. `modern[i]`'s instance dict is `modern_dicts[i]`, and so on."""

    modern: list[Any]  # TE >= 1.8 layers (they have `_fp8_workspaces`), in walk order
    modern_dicts: list[dict]
    legacy: list[Any]  # TE < 1.8 layers (`fp8_weight_shapes`)
    legacy_dicts: list[dict]
    graph_mark: str | None
    unreadable: list[tuple[Any, Exception]]  # modules reading which raised: left alone, reported
    every: list[Any]  # with every=True: every readable module, pre-order, children in order
    every_dicts: list[dict]


def child_modules(module: Any) -> list[tuple[str, Any]]:
    """(name, child) of `module`, even when its class overrides `__dict__`: the generic attribute
    lookup reads the instance dict directly, never through a `__dict__` property."""
    try:
        children = object.__getattribute__(module, "_modules")
        return [(k, v) for k, v in children.items() if v is not None] if isinstance(children, dict) else []
    except Exception:
        return []


def walk(chunk: Any, *, marks: GraphMarks = TE_ONLY, every: bool = False, seen: set[int] | None = None) -> Tree:
    """One pass over the module tree reading instance dicts only, pre-order with children in order
    (as `named_modules()`). This loop runs once per module of a model of up to millions of modules,
    hence the local aliases. A module that cannot be read costs only itself: its children are
    still walked. `marks`: a framework's module marks of a graphed chunk, besides TE's own. `seen`:
    ids of modules already walked (in an earlier chunk of the same call), skipped here and added to."""
    found = Tree([], [], [], [], None, [], [], [])  # its lists filled in place, its graph mark set at the end
    modern, modern_dicts, legacy, legacy_dicts, graph_mark, unreadable, everything, every_dicts = found
    submodule, captured = marks.submodule, marks.captured
    seen = set() if seen is None else seen
    stack = [chunk]
    pop, push, mark_seen = stack.pop, stack.extend, seen.add
    while stack:
        module = pop()
        if module is None or id(module) in seen:
            continue
        mark_seen(id(module))
        try:
            d = module.__dict__
            children = d.get("_modules")
            if children:
                if graph_mark is None and children.get(submodule) is not None:
                    graph_mark = f"{type(module).__name__}.{submodule} is set"
                push(reversed(children.values()))
            if graph_mark is None and captured in d and d[captured]:
                graph_mark = f"{type(module).__name__}.{captured} holds captured graphs"
            if graph_mark is None and ("forward" in d or "reset" in d or "backward_dw" in d):
                graph_mark = te_graph_mark(module, d)
            if WORKSPACES in d:
                modern.append(module)
                modern_dicts.append(d)
            elif LEGACY_MARKER in d:
                legacy.append(module)
                legacy_dicts.append(d)
            if every:
                everything.append(module)
                every_dicts.append(d)
        except Exception as exc:
            unreadable.append((module, exc))
            push(reversed([child for _, child in child_modules(module)]))
    return found._replace(graph_mark=graph_mark)
