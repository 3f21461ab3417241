"""Whether a model chunk is CUDA-graphed: TE's own marks, and a framework's handed down as data.

A captured CUDA graph keeps the addresses of TE's workspaces: freed, a replay touches memory that now
belongs to someone else, so a chunk with graphs on is never cleared. TE (`make_graphed_callables`)
marks the modules it graphs; a framework says it in its config and its own module marks, which
integrations/ hands down as `GraphMarks` (Megatron's: integrations/megatron.py) at every clearing.
The walk over a chunk notices the module marks on its way (`te_graph_mark`, `GraphMarks.submodule`,
`GraphMarks.captured`), and `cuda_graph_reason` adds what the chunk's config says. Attribute names
only: nothing is imported. What the process as a whole holds in graph pools (read from the
allocator) is te/process_globals.py's `private_pools`, next to its users.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, NamedTuple


class GraphMarks(NamedTuple):
    """A framework's marks of a CUDA-graphed chunk. The empty default marks nothing: TE's own only."""

    config: str = ""  # the instance attribute that holds the model's config
    wrapped: str = ""  # the child a wrapper keeps its model in: the config is looked for down it too
    switches: tuple[tuple[str, tuple[object, ...]], ...] = ()  # (config attribute, its values meaning "off")
    submodule: str = ""  # a child module by this name is set on a graphed module
    captured: str = ""  # an instance attribute by this name holds a graphed module's captured graphs


TE_ONLY = GraphMarks()

# TE's own marks (transformer_engine/pytorch/graph.py, 1.9 - 2.20; checked against each release's
# graph.py by tests/hostile/test_te_cuda_graphs.py):
# `make_graphed_callables(module, ...)` sets instance attributes that are functions of that module:
# `forward` = `_make_graphed_callables.<locals>.make_graphed_forward.<locals>.new_fwd` (without `_order`),
# before 2.8 also `forward` = `make_graphed_callables.<locals>.wrap_autocast.<locals>.forward_func`
# (left in place even with `_order`), and from 2.10 `reset` / `backward_dw`. Recognised by the
# function's module, so a renamed closure in a later release is still caught.
TE_GRAPH_MODULE = "transformer_engine.pytorch.graph"
TE_GRAPH_ATTRS = ("forward", "reset", "backward_dw")


def te_graph_mark(module: Any, d: dict) -> str | None:
    """What TE's `make_graphed_callables` left on `module`, whose instance dict is `d` (an instance
    attribute that is a function of TE's graph module), or None."""
    for name in TE_GRAPH_ATTRS:
        value = d.get(name)
        # TE's marks are plain functions, whose `__module__` is a field: anything else under that
        # name (a lazy proxy would run its factory at the attribute read) is not read further.
        if type(value) is FunctionType and value.__module__ == TE_GRAPH_MODULE:
            function = str(value.__qualname__).rsplit(".", 1)[-1]
            return f"{type(module).__name__}.{name} is TE's {function} from make_graphed_callables"
    return None


def cuda_graph_reason(chunk: Any, graph_mark: str | None, marks: GraphMarks) -> str | None:
    """Why clearing this chunk would be unsafe because of CUDA graphs, or None.

    `graph_mark` is what the walk over the chunk found (a module mark); the config named by `marks`
    says whether graphs are on, for the chunk and every wrapper around its model."""
    # the chunk, then its model down the wrappers, 8 deep (past the last one `obj` is None: it has no `__dict__`)
    obj = chunk
    for _ in range(8):
        d = obj.__dict__ if hasattr(obj, "__dict__") else {}
        config = d.get(marks.config)
        if config is not None:
            for switch, off in marks.switches:
                value = getattr(config, switch, None)
                if value not in off:
                    return f"config.{switch}={value!r}"
        obj = d.get("_modules", {}).get(marks.wrapped)
    return graph_mark
