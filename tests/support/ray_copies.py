"""What a `@ray.remote` class runs in its actor process: Ray's by-value copy of an inherited method,
wrapped in its tracing closure (which takes Ray's `_ray_trace_ctx` keyword), on a subclass Ray makes."""

from __future__ import annotations

import functools
from typing import Any


def actor_class_with_a_traced_copy(cls: type, name: str) -> tuple[type, Any]:
    """(the actor's class, the copy of `cls.name` it holds), made from what `cls` holds now: the
    shim's wrapper's `__wrapped__`, where it is patched, as Ray copies the function itself."""
    held = vars(cls)[name]
    original = getattr(held, "__wrapped__", held)

    @functools.wraps(original)
    def traced_copy(self: Any, *args: Any, _ray_trace_ctx: Any = None, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    return type(f"ActorClass({cls.__name__})", (cls,), {name: traced_copy}), traced_copy
