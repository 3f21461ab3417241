"""What an integration may tell the engine about calls and classes it does not know.

The engine patches any framework's function or method without knowing the framework. Two things a
framework can do to a patched entry point are declared here by that framework's integration, never
imported by the engine:

- add a keyword argument of its own to the call, which is no parameter of the target and no model
  (Ray's tracing closure passes `_ray_trace_ctx` to actor methods): `ignore_keyword(name)`.
- put something that is not a class where the table names one (a `@ray.remote` class is an
  ActorClass whose user class is inside it): `find_classes_with(finder)`, a function that returns
  the class behind such an object, or None.

And one thing every clearing hands down to te/: a framework's marks of a CUDA-graphed chunk
(`know_cuda_graphs`; Megatron's config switches). integrations/__init__.py tells them, so they are
known before anything of integrations/ can patch a target or arm the flush net.

Registering is idempotent. Standard library only: the handler reads it at every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_offload_shim import _switches
from te_offload_shim._reload import kept
from te_offload_shim.te.graphs import TE_ONLY, GraphMarks

if TYPE_CHECKING:
    from collections.abc import Callable

    ClassFinder = Callable[[object], "type | None"]

# replaced, never edited: read without a lock; kept across a reload, as every module's state
_ignored_keywords: frozenset[str] = kept(globals(), "_ignored_keywords", frozenset)
_class_finders: tuple[ClassFinder, ...] = kept(globals(), "_class_finders", tuple)
_cuda_graphs: GraphMarks = kept(globals(), "_cuda_graphs", lambda: TE_ONLY)


def ignore_keyword(name: str) -> None:
    """Calls of patched targets may carry `name`, which is not a target's own parameter."""
    global _ignored_keywords
    _ignored_keywords = _ignored_keywords | {name}


def ignored_keywords() -> frozenset[str]:
    return _ignored_keywords


def find_classes_with(finder: ClassFinder) -> None:
    """`finder(obj)` returns the class behind `obj` where the table names a class, or None."""
    global _class_finders
    if finder not in _class_finders:
        _class_finders = (*_class_finders, finder)


def class_behind(obj: object) -> type | None:
    """The class an integration finds behind `obj` (not itself a class), or None."""
    for finder in _class_finders:
        cls = finder(obj)
        if isinstance(cls, type):
            return cls
    return None


def know_cuda_graphs(marks: GraphMarks) -> None:
    """A framework's marks of a CUDA-graphed chunk, handed to te/ at every clearing."""
    global _cuda_graphs
    _cuda_graphs = marks


def cuda_graphs() -> GraphMarks | None:
    """What a clearing hands te/: the marks told, or None where the user says their graphs are
    re-captured after an offload (`TE_OFFLOAD_SHIM_FORCE_CUDA_GRAPHS=1`: graphs then keep nothing)."""
    return None if _switches.force_with_cuda_graphs() else _cuda_graphs
