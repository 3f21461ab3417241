"""What a module's state was before `importlib.reload` ran the module again.

IPython's autoreload and plugin reloaders reload every module of a package, and a reload runs the
module's body again in the same namespace. Only what a reload must keep is taken from that
namespace when it is there: what the package put in place outside itself and must find again (the
wrappers: the registry's records and states, the net's arming; the layers its hooks noted; what the
integrations told the engine, which the wrappers read at every call; its handler on the logger) and
the list of its locks (a fork must still re-initialise those made before). Everything else (the
counters, the warnings already given, the searches' findings, the stats file's path) starts afresh.
docs/guarantees.md ("What a reload keeps") lists each holder and why.
Standard library only, and nothing at all at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def kept(namespace: dict[str, object], name: str, make: Callable[[], T]) -> T:
    """`namespace[name]` as the module's previous run left it (a reload), else a new `make()`."""
    value = namespace.get(name)
    return value if value is not None else make()  # type: ignore[return-value]
