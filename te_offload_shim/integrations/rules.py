"""The rules the target table refers to: when a framework's call is left alone (skip rules), and
where the models are when the argument is not the model (resolvers).

Each skip rule is a function of the bound call (parameter name -> value) that returns the reason the
call is left alone, or None to clear. Its reasons are of two kinds: the call moves no weights
(`move_params=False`), or the framework clears the caches itself behind a flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from te_offload_shim.engine.schema import Skip


def skip_when_false(param: str, why: str) -> Skip:
    """Leave the call alone when `param` is passed false (it defaults to moving the weights)."""

    def skip(call: Mapping[str, Any]) -> str | None:
        value = call.get(param, True)
        return None if value else f"{param}={value!r}: {why}"

    return skip


def skip_unless_model_params(call: Mapping[str, Any]) -> str | None:
    """ROLL: `include=None` means every state; otherwise the list must name model params."""
    include = call.get("include")
    if include is None:
        return None
    if isinstance(include, str):  # one OffloadStateType (a str Enum) rather than a list of them
        include = (include,)
    try:
        named = any("model_params" in (getattr(item, "name", item), getattr(item, "value", item)) for item in include)
    except TypeError:  # one item that is no list
        named = getattr(include, "name", include) == "model_params"
    return None if named else "include names no model_params: the weights stay on the device"


def skip_unless_weights(call: Mapping[str, Any]) -> str | None:
    """AReaL awex: `tags = tags or ["optimizer", "weights"]`, so an empty list means both too."""
    tags = call.get("tags")
    return None if not tags or "weights" in tags else "tags name no weights: the weights stay on the device"


def nemo_rl_clears_itself(call: Mapping[str, Any]) -> str | None:
    """NeMo-RL >= 0.7 clears the caches itself when `policy.megatron_cfg.fp8_cfg.force_clear_fp8_caches`
    (read as `self.fp8_cfg.get("force_clear_fp8_caches", False)`, megatron_policy_worker.py @04fc1377)."""
    fp8_cfg = getattr(call.get("self"), "fp8_cfg", None)
    get = getattr(fp8_cfg, "get", None)  # a dict, or an OmegaConf DictConfig
    if callable(get) and get("force_clear_fp8_caches", False):
        return "NeMo-RL fp8_cfg.force_clear_fp8_caches is on: it clears the caches itself"
    return None


def miles_clears_itself(call: Mapping[str, Any]) -> str | None:
    """miles PR #2142: `--clear-quantized-weight-workspaces-on-offload` (default on)."""
    args = getattr(call.get("self"), "args", None)
    if getattr(args, "clear_quantized_weight_workspaces_on_offload", False):
        return "miles --clear-quantized-weight-workspaces-on-offload is on: it clears the caches itself"
    return None


def megatron_buffer_modules(buffer: Any) -> tuple[Any, list[Any]]:
    """megatron-core: only the TE layers whose weights live in the offloaded buffer: (model chunk to
    walk, parameters whose TE layers to clear). The owner search (integrations/megatron_ddp.py) loads
    at this target's first call."""
    from te_offload_shim.integrations.megatron_ddp import modules_of_buffer

    return modules_of_buffer(buffer)
