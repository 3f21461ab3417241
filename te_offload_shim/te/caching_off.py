"""Configurations under which Transformer Engine caches no FP8 weight copy at all, read from a TE
layer's instance dict, so that a report says "nothing to clear: caching is off" instead of a bare 0.

- Megatron's `TransformerConfig.disable_parameter_transpose_cache`: its TE wrappers (TELinear,
  TELayerNormColumnParallelLinear, TEGroupedLinear in megatron/core/extensions/transformer_engine.py,
  megatron-core 0.16) copy it onto the module in `__init__` and then pass `is_first_microbatch=None`
  to TE, which caches under no name.
- TE 2.16+ under FSDP2: Linear, LayerNormLinear and LayerNormMLP use no cache name when
  `self.is_fsdp2` (module/linear.py, layernorm_linear.py, layernorm_mlp.py); the property keeps its
  answer in `_is_fsdp2` from the first forward on. GroupedLinear reads no such flag.

Only an empty workspace dict is put down to these: a layer that holds entries all the same (a flag
set after it cached) is cleared as any other.
"""

from __future__ import annotations

# (instance attribute, what the reports say), in the order they are checked
CACHING_OFF = (
    ("disable_parameter_transpose_cache", "Megatron disable_parameter_transpose_cache"),
    ("_is_fsdp2", "TE under FSDP2"),
)


def count_caching_off(d: dict, off: dict[str, int]) -> None:
    """Count the TE layer whose instance dict is `d` in `off` under why it caches nothing, if it
    caches nothing by configuration; not at all if it may cache (also when `d` cannot be read: a
    report's remark must not cost the clearing)."""
    try:
        for attribute, reason in CACHING_OFF:
            if d.get(attribute) is True:
                off[reason] = off.get(reason, 0) + 1
                return
    except Exception:
        pass


def describe(off: dict[str, int]) -> str:
    """`{reason: layers}` as one phrase: "12 TE layers (Megatron disable_parameter_transpose_cache)"."""
    layers = sum(off.values())
    return f"{layers} TE layer{'s' if layers != 1 else ''} ({', '.join(sorted(off))})"
