"""TE's own code that marks a module in `make_graphed_callables`, run from a release's real graph.py.

`make_graphed_callables` captures CUDA graphs (it needs a GPU), but the lines that leave marks on
the module do not: `wrap_autocast(block)` (1.9 - 2.7 set `block.forward`; 2.8+ wrap the class's
`__call__` and put it back), `make_graphed_forward(func, ...)` whose `new_fwd` becomes
`func.forward` when `_order` is None, and (2.10+) `make_graphed_attribute_functions(i, ...)` whose
`backward_dw` / `reset` are set on the returned callable. Here those nested functions are made from
the code objects of the release's own `transformer_engine/pytorch/graph.py` and called in TE's
order, so what lands on the module is TE's code with TE's name, qualname and module: nothing is
typed by hand. The globals are the real imported module's when given (harness/te_import.py), else a
dict naming the module as its path does.
"""

from __future__ import annotations

import builtins
import functools
import types
from pathlib import Path
from typing import Any

GRAPH = Path("transformer_engine/pytorch/graph.py")
MODULE = ".".join(GRAPH.with_suffix("").parts)


@functools.cache
def nested_code(source: Path) -> dict[str, types.CodeType]:
    """Every function code object defined in `source`, by name (nested ones included)."""
    found: dict[str, types.CodeType] = {}
    stack = [compile(source.read_text(), str(source), "exec")]
    while stack:
        code = stack.pop()
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found.setdefault(const.co_name, const)
                stack.append(const)
    return found


def _call(code: types.CodeType, globals_: dict, values: dict[str, Any]) -> Any:
    """Make the function `code` describes (its free variables bound to cells holding `values`) and
    call it with the arguments named in `values`."""
    closure = tuple(types.CellType(values.get(name)) for name in code.co_freevars)
    function = types.FunctionType(code, globals_, code.co_name, None, closure)
    return function(*(values[name] for name in code.co_varnames[: code.co_argcount]))


def mark_like_make_graphed_callables(
    module: Any, release_folder: Path, *, order: bool = False, globals_: dict | None = None
) -> Any:
    """Leave on `module` what TE's make_graphed_callables(module, ..., _order=...) leaves on it.

    Returns what TE returns for it (the module without `_order`, the graphed forward with it)."""
    codes = nested_code(release_folder / GRAPH)
    g = globals_ if globals_ is not None else {"__name__": MODULE, "__builtins__": builtins}
    old_call_funcs: dict = {}
    _call(codes["wrap_autocast"], g, {"block": module, "old_call_funcs": old_call_funcs, "module_uses_fp8": {}})

    def graphed(*args: Any, **kwargs: Any) -> Any:  # stands for the captured graph's autograd function
        raise RuntimeError("a captured graph cannot replay on CPU")

    values = {
        "func": module,
        "graph_training_state": module.training,
        "graphed": graphed,
        "orig_fwd": module.forward,
        "te_modules": set(),
        "visited_te_modules": {},
        "helpers": None,
        "graph_idx": 0,
        "fwd_graphs": [None],  # the captured graphs, one per callable
        "bwd_graphs": [None],
        "bwd_dw_graphs": [None],
        "need_bwd_dw_graph": {},
    }
    forward = _call(codes["make_graphed_forward"], g, values)
    if order:
        returned = forward
    else:
        module.forward = forward
        returned = module
    if "make_graphed_attribute_functions" in codes:  # 2.10+
        backward_dw, reset = _call(codes["make_graphed_attribute_functions"], g, values)
        returned.backward_dw = backward_dw
        returned.reset = reset
    for cls, old_call in old_call_funcs.items():  # 2.8+: "Remove FP8 wrapper."
        cls.__call__ = old_call
    return returned
