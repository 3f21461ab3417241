"""What a module's state was before `importlib.reload` ran the module again.

IPython's autoreload and plugin reloaders reload every module of a package, and a reload runs the
module's body again in the same namespace. State that must outlive it (the registry's records, the
counters, the locks, the warnings already given) is taken from that namespace when it is there, or
`uninstall()` and `status()` would lose what was patched, and a lock held across the reload would
be a second lock. Every module of the package that keeps state does it with `kept`, except the
start-up module (`__init__`), which may import no module of ours and needs nothing kept: its finder
on the meta path is reused, and its `install()` patches again what the engine finds patched.
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
