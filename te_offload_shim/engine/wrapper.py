"""Our wrapper type: a wrapt `FunctionWrapper` that is recognisable and otherwise invisible.

- Recognisable: `type(x) is ShimWrapper`, never `isinstance(x, wrapt.FunctionWrapper)` (that is
  anyone's wrapper). Each one carries its registry record, so a disarmed one steps aside.
- Pickles by reference, as a function does: unpickling imports the original's module and looks
  the attribute up, with nothing of this package or wrapt in the stream, so a process that has
  neither (a Ray worker with its own conda/container environment) can load it. A bound method
  pickles as `getattr(instance, name)`, as Python's own bound methods do.
- `copy.copy` / `copy.deepcopy` return the object itself, as they do for functions (wrapt's proxy
  refuses both).
- Static and class methods are wrapped as the descriptors they are, so wrapt binds them as Python
  would (no `self` is invented for a static method, the class is passed to a class method).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import wrapt

if TYPE_CHECKING:
    from te_offload_shim.engine.registry import Record


class _Ref(NamedTuple):
    """Pickles as `import_module(module)` then one `getattr` per qualname part: a pickle stream that
    names only importlib and builtins, never this package."""

    module: str
    parts: tuple[str, ...]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if not self.parts:
            return importlib.import_module, (self.module,)
        return getattr, (_Ref(self.module, self.parts[:-1]), self.parts[-1])


class _Same:
    """`copy.copy` / `copy.deepcopy` return the object itself, as they do for functions (wrapt's proxy
    refuses both); `__reduce__` is `__reduce_ex__` (wrapt's proxy refuses both too)."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: object) -> Any:
        return self


class _BoundShimWrapper(_Same, wrapt.BoundFunctionWrapper):  # type: ignore[misc]
    def __reduce_ex__(self, protocol: object) -> tuple[Any, tuple[Any, ...]]:
        record: Record = self._self_parent._self_record
        holder = self._self_instance if self._self_instance is not None else record.owner
        return getattr, (holder, record.name)


class ShimWrapper(_Same, wrapt.FunctionWrapper):  # type: ignore[misc]
    """`record.original` wrapped by `handler(wrapped, instance, args, kwargs)`; `ref` is the
    (module, qualname) it pickles as."""

    __bound_function_wrapper__ = _BoundShimWrapper

    def __init__(self, wrapped: Any, handler: Any, record: Record, ref: tuple[str, str]) -> None:
        super().__init__(wrapped, handler)
        self._self_record = record
        self._self_ref = _Ref(ref[0], tuple(ref[1].split(".")))  # loads `module.qualname` by import

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # A plain function read from its class, and a static method read from anywhere, is the
        # very object in the class dict, as without us: `getattr(cls, name) is` it, which is how
        # pickle and cloudpickle decide that a function can be pickled by reference.
        if self._self_binding == "staticmethod" or (instance is None and self._self_binding == "function"):
            return self
        return super().__get__(instance, owner)

    def __reduce_ex__(self, protocol: object) -> tuple[Any, tuple[Any, ...]]:
        return self._self_ref.__reduce__()


# Ours by the class's name in this module, not by identity: a reloaded module has new classes, and
# the wrappers made before the reload are ours all the same (patching must not stack another).
_OURS = frozenset({"ShimWrapper", "_BoundShimWrapper"})


def is_ours(obj: object) -> bool:
    cls = type(obj)
    return cls.__qualname__ in _OURS and cls.__module__ == __name__


def _chain(obj: Any) -> Iterator[Any]:
    """`obj` and everything down its `__wrapped__` chain (through a staticmethod/classmethod)."""
    # type(), not isinstance(): a proxy (ours included) claims the class of what it wraps
    if issubclass(type(obj), (staticmethod, classmethod)):
        obj = obj.__func__
    for _ in range(16):
        yield obj
        try:
            obj = getattr(obj, "__wrapped__", None)
        except Exception:
            return
        if obj is None:
            return


def origin(obj: object) -> tuple[str, str]:
    """(module, qualified name) of the function at the end of `obj`'s `__wrapped__` chain: how a
    copy of a function (Ray's tracing closure around it) is recognised."""
    *_, last = _chain(obj)
    return getattr(last, "__module__", ""), getattr(last, "__qualname__", "")


def shim_layers(obj: object) -> int:
    """How many of our wrappers are stacked in `obj`, looking through any `__wrapped__` chain and
    through a staticmethod/classmethod."""
    return sum(1 for o in _chain(obj) if is_ours(o))


def armed_layers(obj: object) -> int:
    """Like `shim_layers`, counting only wrappers whose record is still armed."""
    return sum(1 for o in _chain(obj) if type(o).__qualname__ == "ShimWrapper" and is_ours(o) and o._self_record.armed)
