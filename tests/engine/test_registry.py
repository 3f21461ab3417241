"""The registry of patches (te_offload_shim/engine/registry.py) through its own functions: a record
put in place and undone, the module globals that alias what it patched pointed along (and only where
the record asks; past a module whose globals change while they are read), what `deactivate()` says
of a patch it cannot undo, and that nothing lands once the shim is uninstalled. Records made and put
in place by hand run in this process; those added to the registry (`add`, `deactivate`) run in a
fresh interpreter, whose registry is the test's alone."""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from te_offload_shim.engine import registry


def _functions() -> tuple[Any, Any]:
    """Two functions made for one test: never module globals here, which a rebind would point along
    with the modules' it is tested on."""

    def original() -> str:
        return "original"

    def replacement() -> str:
        return "replacement"

    return original, replacement


@pytest.fixture
def modules() -> Iterator[list[types.ModuleType]]:
    """Modules made for one test, each in sys.modules under a name of its own, taken out after it."""
    made: list[types.ModuleType] = []
    yield made
    for module in made:
        sys.modules.pop(module.__name__, None)


def _module(made: list[types.ModuleType], name: str, **values: Any) -> types.ModuleType:
    module = types.ModuleType(f"_te_offload_shim_test_registry_{name}")
    vars(module).update(values)
    sys.modules[module.__name__] = module
    made.append(module)
    return module


def test_rebind_points_every_module_global_holding_the_old_object_at_the_new_past_entries_that_are_not_modules(
    modules: list[types.ModuleType],
) -> None:
    """An entry of sys.modules that is no module (a placeholder, a lazy module: nothing to read
    without running code) is passed over; every module after it is still searched."""
    original, replacement = _functions()
    placeholder = "_te_offload_shim_test_registry_placeholder"
    sys.modules[placeholder] = object()  # type: ignore[assignment]
    try:
        first = _module(modules, "first", f=original, g=original, other=len)
        second = _module(modules, "second", h=original)
        registry.rebind(original, replacement)
        assert (first.f, first.g, first.other, second.h) == (replacement, replacement, len, replacement)
        registry.rebind(replacement, original)
        assert (first.f, first.g, second.h) == (original, original, original)
    finally:
        del sys.modules[placeholder]


class Base:
    def offload(self) -> str:
        return "base"


def test_restoring_what_the_owner_did_not_have_of_its_own_deletes_ours() -> None:
    """A method the class inherits, patched on the class itself: undoing it deletes our attribute,
    and the inherited one shows again."""

    class Engine(Base):
        pass

    record = registry.Record("test", Engine, "offload", registry.ABSENT)
    record.replacement = lambda self: "ours"
    Engine.offload = record.replacement  # type: ignore[method-assign]  # in place, as registry.add puts it
    assert record.in_place() and Engine().offload() == "ours"
    assert record.restore() is True
    assert "offload" not in vars(Engine) and Engine().offload() == "base"
    assert record.restore() is False, "gone already: nothing to undo"


def test_restoring_a_record_with_aliases_points_them_back_at_the_original(modules: list[types.ModuleType]) -> None:
    original, replacement = _functions()
    owner = _module(modules, "owner", f=replacement)
    holder = _module(modules, "holder", f=replacement)  # `from owner import f` made after the patch
    record = registry.Record("test", owner, "f", original, aliases=True)
    record.replacement = replacement
    assert record.restore() is True
    assert owner.f is original and holder.f is original


def test_restoring_a_record_replaced_since_leaves_the_newcomer_and_without_aliases_touches_no_other_module(
    modules: list[types.ModuleType],
) -> None:
    original, replacement = _functions()
    owner = _module(modules, "owner", f=len)  # something else put there since
    holder = _module(modules, "holder", f=replacement)
    record = registry.Record("test", owner, "f", original)
    record.replacement = replacement
    assert record.restore() is False
    assert owner.f is len and holder.f is replacement


@pytest.mark.subprocess()
def test_add_puts_the_replacement_in_place_and_points_the_aliases_only_where_the_record_asks() -> None:
    import te_offload_shim  # noqa: F401  (installs the shim: the registry takes patches)

    # made here, not module globals: a rebind would point the test's own names along with the others
    def f() -> str:
        return "f"

    def g() -> str:
        return "g"

    def wrapper_f() -> str:
        return "wrapped f"

    def wrapper_g() -> str:
        return "wrapped g"

    owner = types.ModuleType("_te_offload_shim_test_registry_owner")
    holder = types.ModuleType("_te_offload_shim_test_registry_holder")
    for module in (owner, holder):  # `from owner import f, g` made before the patches
        vars(module).update(f=f, g=g)
    sys.modules[owner.__name__], sys.modules[holder.__name__] = owner, holder
    aliased = registry.Record("test", owner, "f", f, aliases=True)
    plain = registry.Record("test", owner, "g", g)  # no `aliases`: a class's or Ray's kind of patch
    assert registry.add(aliased, wrapper_f) and registry.add(plain, wrapper_g)
    assert (owner.f, holder.f) == (wrapper_f, wrapper_f)
    assert (owner.g, holder.g) == (wrapper_g, g), "a record without aliases leaves other modules alone"
    assert registry.records("test") == [aliased, plain] and aliased.replacement is wrapper_f
    assert registry.deactivate() == (2, [])
    assert (owner.f, holder.f, owner.g, holder.g) == (f, f, g, g)


class Refusing(type):
    """A class that refuses to have its attributes set once `frozen`."""

    frozen = False

    def __setattr__(cls, name: str, value: Any) -> None:
        if Refusing.frozen:
            raise PermissionError(f"{cls.__name__} is frozen")
        super().__setattr__(name, value)


@pytest.mark.subprocess()
def test_deactivate_disarms_every_record_undoes_the_others_and_says_which_it_could_not_undo() -> None:
    import te_offload_shim  # noqa: F401

    class Frozen(metaclass=Refusing):
        def offload(self) -> str:
            return "frozen"

    class Open:
        def offload(self) -> str:
            return "open"

    frozen_raw, open_raw = vars(Frozen)["offload"], vars(Open)["offload"]
    stuck = registry.Record("test", Frozen, "offload", frozen_raw)
    undone = registry.Record("test", Open, "offload", open_raw)
    assert registry.add(stuck, lambda self: "ours") and registry.add(undone, lambda self: "ours")
    registry.set_state("t", "patched", "")
    Refusing.frozen = True
    assert registry.deactivate() == (1, ["test offload: PermissionError: Frozen is frozen"])
    assert not stuck.armed and not undone.armed, "disarmed, undone or not: a wrapper left steps aside"
    assert repr(stuck) == "Record('test', 'offload', target=None, armed=False)"
    assert vars(Open)["offload"] is open_raw and Frozen().offload() == "ours"
    assert registry.records() == [] and registry.state("t") is None


@pytest.mark.subprocess()
def test_once_the_shim_is_uninstalled_no_patch_lands() -> None:
    import te_offload_shim

    def f() -> str:
        return "f"

    te_offload_shim.uninstall()
    owner = types.ModuleType("_te_offload_shim_test_registry_owner")
    vars(owner)["f"] = f
    assert registry.add(registry.Record("test", owner, "f", f, aliases=True), len) is False
    assert owner.f is f and registry.records() == []


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="Python 3.12+ collects garbage between bytecodes only, never inside the copy"
)
def test_rebind_passes_over_a_module_whose_globals_change_while_it_reads_them_and_searches_the_rest(
    modules: list[types.ModuleType],
) -> None:
    """A module's globals changed while rebind copies them raise RuntimeError there: that module is
    passed over (its aliases come later), and every module after it is still searched. What changes
    them here is code the garbage collector runs inside the copy (a collection's callback, as a
    finalizer would), which Python 3.10 and 3.11 do at an allocation; the module is larger than the
    free list of pairs, so the copy allocates."""
    original, replacement = _functions()
    busy = _module(modules, "busy", f=original, **{f"x{i}": i for i in range(5000)})
    after = _module(modules, "after", f=original)
    added: list[str] = []

    def fill(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and sys._getframe(1).f_locals.get("module") is busy:
            added.append(f"late{len(added)}")
            setattr(busy, added[-1], None)

    threshold = gc.get_threshold()
    gc.callbacks.append(fill)
    gc.set_threshold(1)
    try:
        registry.rebind(original, replacement)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(fill)
    assert added, "no collection ran while rebind read the busy module"
    assert busy.f is original and after.f is replacement
