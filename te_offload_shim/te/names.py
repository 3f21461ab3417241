"""The names of a chunk's modules for skip and error records, as `named_modules()` gives them.

Loaded only when a record needs a name (te/caches.py; the residue report, which names what it
finds): a clearing that meets nothing odd never loads it.
"""

from __future__ import annotations

from typing import Any

from te_offload_shim.te.walk import child_modules


class Names:
    """A module's name is worked out only when a record needs one, and without recursion:
    `named_modules()` recurses, so it raises RecursionError on a tree deeper than the recursion
    limit. One pass stores each module's parent link; a name is then put together by following the
    links up."""

    def __init__(self, index: int, chunk: Any) -> None:
        self.prefix = f"chunk{index}"
        self._chunk = chunk
        self._links: dict[int, tuple[int, str] | None] | None = None

    def __call__(self, module: Any) -> str:
        links = self._links
        if links is None:  # the first name asked for: link every module to its parent
            links = self._links = {}
            stack: list[tuple[Any, tuple[int, str] | None]] = [(self._chunk, None)]
            while stack:  # pre-order, children in order: a shared module keeps its first name
                node, up = stack.pop()
                if id(node) not in links:
                    links[id(node)] = up
                    stack.extend((child, (id(node), key)) for key, child in reversed(child_modules(node)))
        if id(module) not in links:
            return f"{self.prefix}.<{type(module).__name__}>"
        keys = []
        link = links[id(module)]
        while link is not None:
            parent, key = link
            keys.append(key)
            link = links[parent]
        return ".".join([self.prefix, *reversed(keys)])
