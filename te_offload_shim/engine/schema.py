"""The engine's schema of a target: `Target`, its `where` spec (`Where`), its skip rule (`Skip`).
The built-in table (integrations/targets.py) and the user's entries of `TE_OFFLOAD_SHIM_TARGETS`
(parsed by integrations/user_targets.py) are both made of these; the patcher and the call handler
read nothing else.

`where` spec, shared by the table and `TE_OFFLOAD_SHIM_TARGETS`: a parameter name (`models`, `self`)
or a position (`arg0` is the first argument after `self`), then optional `.attr` steps, the last of
which may end in `()` for a call without arguments: `self.model.get_models()`. Empty means the first
argument. It is parsed, never evaluated: no step may be a dunder (`__dict__`), a spec that calls names
public attributes only, and the call is made only to a method written in Python (engine/handler.py).

`skip`: a function of the bound call (a mapping of parameter names to values) that returns why this
call is left alone, a short reason that is logged and counted in `stats()["left_alone"]`, or None to
clear the caches.

`resolve`: a function of the located models that returns (model chunks, parameters to limit the
clearing to), for an entry point whose argument is not the model itself (a Megatron DDP buffer).

Standard library only: `te-offload-shim status` and the install of user targets read it without
loading wrapt, torch or a framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    Skip = Callable[[Mapping[str, Any]], "str | None"]
    Resolve = Callable[[Any], tuple[Any, Any]]


class Where(NamedTuple):
    """A parsed `where` spec."""

    root: str
    path: tuple[str, ...]
    call: bool
    text: str

    def parameter(self, names: list[str], is_method: bool) -> str | None:
        """The parameter the spec starts from, given the function's parameter names; `argN`
        counts after `self` for a method. None when the function has no such parameter."""
        if self.root.startswith("arg") and self.root[3:].isdigit():
            positional = names[1:] if is_method else names
            index = int(self.root[3:])
            return positional[index] if index < len(positional) else None
        return self.root if self.root in names else None


def parse_where(text: str) -> Where:
    """Parse a `where` spec; raise ValueError with a readable message when malformed."""
    spec = text.strip()
    if not spec:
        return Where("arg0", (), False, "")
    call = spec.endswith("()")
    parts = spec.removesuffix("()").split(".")
    if not all(p.isidentifier() for p in parts):
        raise ValueError(f"bad models spec {text!r}: expected NAME[.attr...][()] such as self.model")
    if call and len(parts) < 2:
        raise ValueError(f"bad models spec {text!r}: '()' must follow an attribute, e.g. self.model.get_models()")
    # A spec reads where the models are; it must never be a way to run code. No step reaches into
    # Python's own attributes, and a spec that calls a method names only public ones (the handler
    # also calls only a method written in Python, never a built-in such as list.clear).
    dunders = [p for p in parts if p.startswith("__") and p.endswith("__")]
    if dunders:
        raise ValueError(
            f"bad models spec {text!r}: {dunders[0]} is refused (a spec never reads Python's own attributes)"
        )
    private = [p for p in parts if p.startswith("_")]
    if call and private:
        raise ValueError(
            f"bad models spec {text!r}: {private[0]} is private, and a spec that calls a method names public "
            "attributes only"
        )
    return Where(parts[0], tuple(parts[1:]), call, spec)


class Target:
    """One patchable entry point. `requires` is a requirement string, `verl>=0.4.0`: the
    distribution whose installed version `status` checks, then the releases the entry point exists
    in as described (a PEP 440 specifier set); either part may be left out (integrations/targets.py)."""

    def __init__(
        self,
        name: str,
        module: str,
        attribute: str,
        where: str = "",
        *,
        requires: str = "",
        fixed_in: str | None = None,
        fixed_marker: str | None = None,
        note: str = "",
        skip: Skip | None = None,
        resolve: Resolve | None = None,
        user: bool = False,
    ) -> None:
        self.name = name
        self.module = module
        self.attribute = attribute
        self.where = parse_where(where)
        cut = next((i for i, c in enumerate(requires) if c in "<>=!~"), len(requires))
        self.distribution = requires[:cut] or None
        self.supported = requires[cut:] or None
        self.fixed_in = fixed_in
        self.fixed_marker = fixed_marker
        self.note = note
        self.skip = skip
        self.resolve = resolve
        self.user = user  # from TE_OFFLOAD_SHIM_TARGETS: an absent attribute is then a mistake

    @property
    def path(self) -> str:
        return f"{self.module}:{self.attribute}"

    def __repr__(self) -> str:
        return f"Target({self.name!r}, {self.path!r})"
