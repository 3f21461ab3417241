"""The chunk policy: which model chunks a call's `models` argument holds, shared by the clearing
(`caches`) and the residue report, so that both look into exactly the same things. torch is taken
from `sys.modules`: if it is not imported, there is no module to find.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from te_offload_shim._log import warn_once


def as_chunks(models: object) -> tuple[list[Any], str | None]:
    """The model chunks in `models`, and why `models` was not looked into (None when it was).

    Only a module (one chunk), a list or a tuple (subclasses too) are looked into, a list or tuple
    through `list.__iter__` / `tuple.__iter__`: the offload iterates `models` itself right after
    us, so iterating anything else (a generator, a class whose `__iter__` drains a queue, an
    overridden `__iter__`) could change what it then sees. A value that is not iterable at all is
    passed over in silence: the offload raises its own error for it."""
    torch = sys.modules.get("torch")
    if models is None or torch is None:
        return [], None
    module_type = torch.nn.Module
    if isinstance(models, module_type):
        return [models], None
    cls = type(models)
    if issubclass(cls, (list, tuple)):  # the base class's own iterator, never an override
        items: Iterator[Any] = (list if issubclass(cls, list) else tuple).__iter__(models)  # type: ignore[arg-type]
        return [m for m in items if isinstance(m, module_type)], None
    if getattr(cls, "__iter__", None) is None and getattr(cls, "__getitem__", None) is None:
        return [], None
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    what = f"a one-shot iterator ({name})" if isinstance(models, Iterator) else f"a {name}"
    warn_once(
        f"not-iterated:{name}",
        "te_offload_shim: models given as %s; FP8 caches not cleared: the shim looks only into a module, a list "
        "or a tuple, since iterating anything else could change what the offload sees. Pass a list.",
        what,
    )
    return [], f"models is {what}, not a module, list or tuple: not iterated, nothing cleared"
