"""WHAT to patch: one declarative entry per framework entry point.

Adding a target is adding an entry to `BUILTIN`. An entry names the module to watch, the attribute
(`func` or `Class.method`), where the model chunks are in a call (a `where` spec, below), an
optional condition on the call, and how to see that upstream already clears the caches.

`where` spec, shared with `TE_OFFLOAD_SHIM_TARGETS`: a parameter name (`models`, `self`) or a
position (`arg0` is the first argument after `self`), then optional `.attr` steps, the last of which
may end in `()` for a call without arguments: `self.model.get_models()`. Empty means the first
argument. It is parsed, never evaluated.

Standard library only: the table is read at `import te_offload_shim`.
"""

TYPE_CHECKING = False  # typing costs milliseconds at every interpreter start

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any


class Where:
    """A parsed `where` spec."""

    __slots__ = ("call", "path", "root", "text")

    def __init__(self, root: "str", path: "tuple[str, ...]", call: "bool", text: "str") -> "None":
        self.root = root
        self.path = path
        self.call = call
        self.text = text

    def __repr__(self) -> "str":
        return f"Where({self.text!r})"

    def parameter(self, names: "list[str]", is_method: "bool") -> "str | None":
        """The parameter the spec starts from, given the function's parameter names; `argN`
        counts after `self` for a method. None when the function has no such parameter."""
        if self.root.startswith("arg") and self.root[3:].isdigit():
            positional = names[1:] if is_method else names
            index = int(self.root[3:])
            return positional[index] if index < len(positional) else None
        return self.root if self.root in names else None


def parse_where(text: "str") -> "Where":
    """Parse a `where` spec; raise ValueError with a readable message when malformed."""
    spec = text.strip()
    if not spec:
        return Where("arg0", (), False, "")
    call = spec.endswith("()")
    body = spec[:-2] if call else spec
    parts = body.split(".")
    if not all(p.isidentifier() for p in parts):
        raise ValueError(f"bad models spec {text!r}: expected NAME[.attr...][()] such as self.model")
    if call and len(parts) < 2:
        raise ValueError(f"bad models spec {text!r}: '()' must follow an attribute, e.g. self.model.get_models()")
    return Where(parts[0], tuple(parts[1:]), call, spec)


class Target:
    """One patchable entry point."""

    __slots__ = (
        "attribute",
        "distribution",
        "fixed_upstream",
        "module",
        "name",
        "resolve",
        "step_aside",
        "user",
        "versions",
        "when",
        "where",
    )

    def __init__(
        self,
        name: "str",
        module: "str",
        attribute: "str",
        where: "str" = "",
        *,
        distribution: "str | None" = None,
        versions: "str" = "",
        when: "Callable[[Mapping[str, Any]], bool] | None" = None,
        step_aside: "Callable[[Mapping[str, Any]], str | None] | None" = None,
        fixed_upstream: "Callable[[ModuleType], bool] | None" = None,
        resolve: "Callable[[Any], tuple[Any, Any]] | None" = None,
        user: "bool" = False,
    ) -> "None":
        self.name = name
        self.module = module
        self.attribute = attribute
        self.where = parse_where(where)
        self.distribution = distribution
        self.versions = versions
        self.when = when
        self.step_aside = step_aside
        self.fixed_upstream = fixed_upstream
        self.resolve = resolve
        self.user = user  # from TE_OFFLOAD_SHIM_TARGETS: an absent attribute is then a mistake

    @property
    def path(self) -> "str":
        return f"{self.module}:{self.attribute}"

    def __repr__(self) -> "str":
        return f"Target({self.name!r}, {self.path!r})"


# --- conditions, referenced by the entries below ------------------------------------------------


def _has_attr(name: "str") -> "Callable[[ModuleType], bool]":
    def check(module: "ModuleType") -> "bool":
        return hasattr(module, name)

    check.__name__ = f"has_{name}"
    return check


def _truthy(param: "str") -> "Callable[[Mapping[str, Any]], bool]":
    def check(call: "Mapping[str, Any]") -> "bool":
        return bool(call.get(param, True))

    check.__name__ = f"{param}_truthy"
    return check


def _offloads_model_params(call: "Mapping[str, Any]") -> "bool":
    """ROLL: `include=None` means every state; otherwise the list must name model params."""
    include = call.get("include")
    if include is None:
        return True
    if isinstance(include, str):  # one OffloadStateType (a str Enum) rather than a list of them
        include = (include,)
    try:
        names = {getattr(item, "name", item) for item in include}
        values = {getattr(item, "value", item) for item in include}
    except TypeError:
        names = values = {getattr(include, "name", include)}
    return "model_params" in names or "model_params" in values


def _nemo_rl_clears_itself(call: "Mapping[str, Any]") -> "str | None":
    """NeMo-RL >= 0.7 clears the caches itself when `policy.megatron_cfg.fp8_cfg.force_clear_fp8_caches`
    (read as `self.fp8_cfg.get("force_clear_fp8_caches", False)`, megatron_policy_worker.py @04fc1377)."""
    fp8_cfg = getattr(call.get("self"), "fp8_cfg", None)
    get = getattr(fp8_cfg, "get", None)  # a dict, or an OmegaConf DictConfig
    if callable(get) and get("force_clear_fp8_caches", False):
        return "NeMo-RL fp8_cfg.force_clear_fp8_caches is on"
    return None


def _miles_clears_itself(call: "Mapping[str, Any]") -> "str | None":
    """miles PR #2142: `--clear-quantized-weight-workspaces-on-offload` (default on)."""
    args = getattr(call.get("self"), "args", None)
    if getattr(args, "clear_quantized_weight_workspaces_on_offload", False):
        return "miles --clear-quantized-weight-workspaces-on-offload is on"
    return None


def _releases_weights(call: "Mapping[str, Any]") -> "bool":
    """AReaL awex: `tags = tags or ["optimizer", "weights"]`, so an empty list means both too."""
    tags = call.get("tags")
    return not tags or "weights" in tags


def _megatron_buffer_modules(buffer: "Any") -> "Any":
    from te_offload_shim.integrations.megatron import modules_of_buffer

    return modules_of_buffer(buffer)


# --- the table ----------------------------------------------------------------------------------

BUILTIN: "tuple[Target, ...]" = (
    Target(
        "verl",
        "verl.utils.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        distribution="verl",
        versions="0.4.0 - 0.8.x; 0.9.0+ clears the caches itself (PR #6952)",
        fixed_upstream=_has_attr("_clear_te_fp8_weight_workspaces"),
    ),
    Target(
        "megatron-core",
        "megatron.core.distributed.param_and_grad_buffer",
        "_ParamAndGradBuffer.offload_to_cpu",
        "self",
        distribution="megatron-core",
        versions="0.16.0+ (the method is absent before)",
        when=_truthy("move_params"),
        resolve=_megatron_buffer_modules,  # only the TE layers whose weights live in the buffer
    ),
    Target(
        "nemo-rl",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorkerImpl.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        versions="0.6.0+ (offload_after_refit calls it through self)",
        step_aside=_nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-0.5",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        versions="0.5.x (a @ray.remote class; 0.6.0+ inherits the patched Impl method)",
        step_aside=_nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-0.3",
        "nemo_rl.models.policy.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        versions="0.3.0 - 0.4.x",
        step_aside=_nemo_rl_clears_itself,
    ),
    Target(
        "roll",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronInferStrategy.offload_states",
        "self.model.get_models()",
        distribution="roll",
        versions="0.1.0 - 0.3.0",
        when=_offloads_model_params,
    ),
    Target(
        "roll-train",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronTrainStrategy.offload_states",
        "self.model.get_models()",
        distribution="roll",
        versions="0.1.0 - 0.3.0 (overrides the Infer method)",
        when=_offloads_model_params,
    ),
    Target(
        "areal-awex",
        "areal.engine.awex.colocate_writer",
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        distribution="areal",
        versions="main since 2026-08-07 (#1500), in no release yet",
        when=_releases_weights,
    ),
    Target(
        "areal-awex-1.0",
        "areal.experimental.weight_update.awex.megatron_adapter",
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        distribution="areal",
        versions="1.0.4 (the PyPI release; moved to areal.engine.awex.colocate_writer on main)",
        when=_releases_weights,
    ),
    Target(
        "areal",
        "areal.engine.megatron_engine",
        "MegatronEngine.offload",
        "self.model",
        distribution="areal",
        versions="1.0.4 - 2.0.0 (flushes before torch_memory_saver.pause)",
    ),
    Target(
        "slime",
        "slime.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        distribution="slime",
        versions="0.2.1 - 0.3.1",
    ),
    Target(
        "miles",
        "miles.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        distribution="miles",
        versions="before PR #2142, or with its flag off",
        step_aside=_miles_clears_itself,
    ),
    # ms-swift, SkyRL, RLinf, ChatLearn, Relax: no upstream fix yet, so no step-aside rule is guessed
    # ahead of one (a fix may come opt-in, like NeMo-RL's, and stepping aside on its mere presence
    # would bring the leak back). Clearing first is harmless next to an upstream clear: it finds the
    # dict already empty.
    Target(
        "ms-swift",
        "swift.megatron.trainers.utils",
        "offload_megatron_model_to_cpu",
        "models",
        distribution="ms-swift",
        versions="3.11.0 - 4.6.0 (a copy of verl's pre-fix offload; flushes through swift.utils.empty_cache)",
    ),
    Target(
        "skyrl",
        "skyrl.backends.skyrl_train.distributed.megatron.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        distribution="skyrl",
        versions="0.1.0 - 0.3.0 (DDP chunks go through megatron-core's buffer offload, plain chunks do not)",
    ),
    Target(
        "skyrl-train",
        "skyrl_train.distributed.megatron.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        distribution="skyrl-train",
        versions="skyrl-train 0.2.0 - 0.4.0 (git tags; before the package became skyrl.backends.skyrl_train)",
    ),
    Target(
        "rlinf",
        "rlinf.hybrid_engines.megatron.megatron_model_manager",
        "MegatronModelManager.offload_model_weights_and_grad",
        "self.model",
        distribution="rlinf",
        versions="0.1 - 0.3.0, main (MegatronWorker, MegatronSftWorker inherit it)",
        when=_truthy("offload_weight"),
    ),
    Target(
        "chatlearn",
        "chatlearn.models.megatron.memory_manager.trainer",
        "TrainerMemoryManager.offload_weights",
        "self._model",
        distribution="pai-chatlearn",
        versions="1.2.0 - main (the caller, TorchModule.offload, flushes after it)",
    ),
    Target(
        "chatlearn-inference",
        "chatlearn.models.megatron.memory_manager.inference",
        "InferenceMemoryManager.offload_weights",
        "self._model",
        distribution="pai-chatlearn",
        versions="1.2.0 - main (reference / reward models; flushed by the same caller)",
    ),
    Target(
        "relax",
        "relax.backends.megatron.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        distribution="relax",
        versions="main, no release (clear_memory, then torch_memory_saver.pause)",
    ),
    Target(
        "relax-selective",
        "relax.backends.megatron.weight_update.train_offload",
        "_SelectiveOffloadStrategy.offload",
        "self.model",
        distribution="relax",
        versions="main since the selective offload (--selective-offload, or no torch_memory_saver)",
    ),
)


def parse_user_targets(text: "str") -> "tuple[list[Target], list[str]]":
    """Parse `TE_OFFLOAD_SHIM_TARGETS`: `pkg.mod:func[@where],pkg.mod:Class.method[@where]`.

    Returns the good entries and one message per malformed entry (the others still work)."""
    targets: list[Target] = []
    problems: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        path, _, where = entry.partition("@")
        module, sep, attribute = path.partition(":")
        if not sep or not all(p.isidentifier() for p in module.split(".")):
            problems.append(f"{entry!r}: expected pkg.module:function or pkg.module:Class.method")
            continue
        parts = attribute.split(".")
        if len(parts) > 2 or not all(p.isidentifier() for p in parts):
            problems.append(f"{entry!r}: attribute must be function or Class.method")
            continue
        try:
            targets.append(Target(path, module, attribute, where, user=True))
        except ValueError as exc:
            problems.append(f"{entry!r}: {exc}")
    return targets, problems
