"""Our wrapper type (te_offload_shim/engine/wrapper.py), in this process: how it is recognised, counted
through other wrappers, bound, pickled and copied. Real wrapt and real registry records; nothing is
installed (a record is only made, never added): the targets are this module's own function and
class, wrapped for one test (monkeypatch puts the originals back).
"""

from __future__ import annotations

import copy
import functools
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pytest
import wrapt

from te_offload_shim.engine import registry
from te_offload_shim.engine.wrapper import ShimWrapper, armed_layers, is_ours, origin, shim_layers

HERE = sys.modules[__name__]


def offload(models: Any) -> tuple:
    return ("offload", models)


class Engine:
    def offload(self, models: Any) -> tuple:
        return ("method", self, models)

    @staticmethod
    def static(models: Any) -> tuple:
        return ("static", models)

    @classmethod
    def klass(cls, models: Any) -> tuple:
        return ("class", cls, models)


def passthrough(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    return wrapped(*args, **kwargs)


Wrap = Callable[..., ShimWrapper]


@pytest.fixture
def wrap(monkeypatch: pytest.MonkeyPatch) -> Wrap:
    """Our wrapper of `owner.name`, put in place as `registry.add` would (by hand: nothing is registered)."""

    def wrap(owner: Any, name: str, *, armed: bool = True) -> ShimWrapper:
        raw = vars(owner)[name]
        record = registry.Record("target", owner, name, raw, target="probe")
        record.armed = armed
        qualname = f"{owner.__qualname__}.{name}" if isinstance(owner, type) else name
        wrapper = ShimWrapper(raw, passthrough, record, (__name__, qualname))
        monkeypatch.setattr(owner, name, wrapper)
        return wrapper

    return wrap


def test_ours_is_told_by_its_type_not_by_what_it_wraps(wrap: Wrap) -> None:
    wrapper = wrap(HERE, "offload")
    assert is_ours(wrapper) and not is_ours(wrapper.__wrapped__)
    assert not is_ours(wrapt.FunctionWrapper(wrapper.__wrapped__, passthrough)), "anyone's wrapt wrapper is not ours"
    impostor = type("ShimWrapper", (), {"__module__": "elsewhere"})()
    assert not is_ours(impostor), "a class of that name in another module is not ours"
    wrap(Engine, "offload")
    assert is_ours(Engine().offload), "a bound method of ours is ours"


def test_layers_are_counted_through_other_wrappers_and_descriptors(wrap: Wrap) -> None:
    wrapper = wrap(HERE, "offload")

    @functools.wraps(wrapper)
    def tracing(*args: Any, **kwargs: Any) -> Any:  # a copy around it, as Ray's tracing makes
        return wrapper(*args, **kwargs)

    assert shim_layers(wrapper) == 1 and shim_layers(tracing) == 1
    assert origin(tracing) == (__name__, "offload")
    again = ShimWrapper(wrapper, passthrough, wrapper._self_record, (__name__, "offload"))
    assert shim_layers(again) == 2
    static, klass = wrap(Engine, "static"), wrap(Engine, "klass")
    assert shim_layers(static) == 1 and shim_layers(klass) == 1
    assert shim_layers(staticmethod(static)) == 1, "through a staticmethod"
    assert shim_layers(classmethod(klass)) == 1, "through a classmethod"
    assert origin(staticmethod(static)) == (__name__, "Engine.static")
    assert shim_layers(Engine.static) == 1 and shim_layers(Engine().klass) == 1


def test_armed_layers_count_only_wrappers_whose_record_is_armed(wrap: Wrap) -> None:
    disarmed = wrap(HERE, "offload", armed=False)
    assert shim_layers(disarmed) == 1 and armed_layers(disarmed) == 0
    record = registry.Record("target", HERE, "offload", disarmed)
    armed = ShimWrapper(disarmed, passthrough, record, (__name__, "offload"))
    assert armed_layers(armed) == 1 and shim_layers(armed) == 2
    assert armed_layers(staticmethod(armed)) == 1, "through a staticmethod"


class Holder:
    """Something that wraps what it holds, as a decorator's `__wrapped__` says."""

    def __init__(self, wrapped: Any) -> None:
        self.__wrapped__ = wrapped


def test_a_wrapped_chain_is_followed_sixteen_deep_and_a_raising_one_is_cut_short(wrap: Wrap) -> None:
    """A `__wrapped__` chain that loops (or is absurdly long) ends the walk; one whose `__wrapped__`
    raises ends it where it raised."""
    wrapper = wrap(HERE, "offload")

    def chain(depth: int) -> Any:
        obj: Any = wrapper
        for _ in range(depth):
            obj = Holder(obj)
        return obj

    assert shim_layers(chain(15)) == 1, "ours is the sixteenth"
    assert shim_layers(chain(16)) == 0, "past the sixteenth"
    assert origin(chain(15)) == (__name__, "offload")
    loop = Holder(None)
    loop.__wrapped__ = loop
    assert shim_layers(loop) == 0 and origin(loop) == (__name__, ""), "an instance: its class's module, no name"

    class Raising:
        @property
        def __wrapped__(self) -> Any:
            raise RuntimeError("no")

    raising = Raising()
    assert shim_layers(raising) == 0 and origin(raising) == (__name__, "")
    assert shim_layers(Holder(raising)) == 0
    assert origin(object()) == ("", ""), "no module, no name: nothing recognised"


def test_a_function_read_from_its_class_is_the_very_object_in_the_class_dict(wrap: Wrap) -> None:
    """As without us: `getattr(cls, name) is vars(cls)[name]` for a plain function, and for a static
    method read from anywhere (pickle and cloudpickle decide on that); an instance's read binds."""
    engine = Engine()
    method, static, klass = (wrap(Engine, n) for n in ("offload", "static", "klass"))
    assert Engine.offload is method
    assert Engine.static is static and engine.static is static
    assert engine.offload is not method and engine.offload(1) == ("method", engine, 1)
    assert Engine.klass is not klass and Engine.klass(2) == ("class", Engine, 2) == engine.klass(2)
    assert static(4) == ("static", 4) and Engine.static(5) == ("static", 5)


def test_wrappers_pickle_by_reference_and_copy_as_themselves(wrap: Wrap) -> None:
    """Unpickled, each is the object in place (found by module and qualified name), and no pickle
    names this package or wrapt; a bound method unpickles bound to (a copy of) its instance."""
    function = wrap(HERE, "offload")
    method, static, klass = (wrap(Engine, n) for n in ("offload", "static", "klass"))
    for obj in (function, method, static, klass):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            data = pickle.dumps(obj, protocol)
            assert b"te_offload_shim" not in data and b"wrapt" not in data
            if obj is klass:  # what `Engine.klass` reads: the class method bound, as without us
                assert pickle.loads(data) == Engine.klass
            else:
                assert pickle.loads(data) is obj
        assert copy.copy(obj) is obj and copy.deepcopy(obj) is obj
    engine = Engine()
    bound = engine.offload
    assert copy.copy(bound) is bound and copy.deepcopy(bound) is bound
    again = pickle.loads(pickle.dumps(bound))
    assert is_ours(again) and type(again.__self__) is Engine and again(6)[::2] == ("method", 6)
    bound_class = Engine.klass
    assert bound_class == pickle.loads(pickle.dumps(bound_class)) and bound_class(7) == ("class", Engine, 7)


def test_reduce_called_by_hand_gives_what_pickle_gets(wrap: Wrap) -> None:
    """Code that calls `__reduce__` itself (wrapt's proxy refuses it) gets the reference pickle gets."""
    function = wrap(HERE, "offload")
    bound = wrap(Engine, "offload").__get__(Engine(), Engine)
    for obj in (function, bound):
        assert obj.__reduce__() == obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
