"""WHAT to patch: one declarative entry per framework entry point.

Adding a target is adding an entry to `BUILTIN`. An entry names the module to watch, the attribute
(`func` or `Class.method`), where the model chunks are in a call (a `where` spec, below), the
releases it applies to, and optionally a rule that leaves a call alone.

`where` spec, shared with `TE_OFFLOAD_SHIM_TARGETS`: a parameter name (`models`, `self`) or a
position (`arg0` is the first argument after `self`), then optional `.attr` steps, the last of which
may end in `()` for a call without arguments: `self.model.get_models()`. Empty means the first
argument. It is parsed, never evaluated.

Releases, declared once per entry and read by `te-offload-shim status` (integrations/versions.py):
- `distribution`: the package whose installed version is checked.
- `supported`: a version specifier set, `>=0.4.0,<0.9.0`, for the releases in which the entry point
  exists as the entry describes it (integrations/specifiers.py has the subset accepted). None when no
  release number is known for it (git-only code, or code in no release yet); `note` then says which
  revisions have it. A release outside the set is a warning in `status`, never a reason not to patch:
  the shim patches what it finds.
- `fixed_in`: the first release that clears the caches itself; from it on the entry is left alone.
  `fixed_marker` is the module attribute that fix added: at run time its presence, not the version
  number, decides (a back-port or a git checkout carries the fix under any number), and a test checks
  that the two agree on the real releases (tests/test_target_table.py, tests/test_verl.py).
- `note`: only what the specifier cannot say.

`skip`: a function of the bound call (a mapping of parameter names to values) that returns why this
call is left alone, a short reason that is logged and counted in `stats()["left_alone"]`, or None to
clear the caches. Its reasons are of two kinds: the call moves no weights (`move_params=False`), or
the framework clears the caches itself behind a flag.

Not read at start-up: `import te_offload_shim` watches the module names written out in
`__init__.BUILTIN_MODULES` (tests/test_layout.py keeps the two in step), and the table is imported
when one of them is. The specifiers are strings here, parsed only by `status` and the tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    Skip = Callable[[Mapping[str, Any]], "str | None"]


class Where:
    """A parsed `where` spec."""

    __slots__ = ("call", "path", "root", "text")

    def __init__(self, root: str, path: tuple[str, ...], call: bool, text: str) -> None:
        self.root = root
        self.path = path
        self.call = call
        self.text = text

    def __repr__(self) -> str:
        return f"Where({self.text!r})"

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
        "fixed_in",
        "fixed_marker",
        "module",
        "name",
        "note",
        "resolve",
        "skip",
        "supported",
        "user",
        "where",
    )

    def __init__(
        self,
        name: str,
        module: str,
        attribute: str,
        where: str = "",
        *,
        distribution: str | None = None,
        supported: str | None = None,
        fixed_in: str | None = None,
        fixed_marker: str | None = None,
        note: str = "",
        skip: Skip | None = None,
        resolve: Callable[[Any], tuple[Any, Any]] | None = None,
        user: bool = False,
    ) -> None:
        self.name = name
        self.module = module
        self.attribute = attribute
        self.where = parse_where(where)
        self.distribution = distribution
        self.supported = supported
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


# --- skip rules, referenced by the entries below ------------------------------------------------


def _skip_when_false(param: str, why: str) -> Skip:
    """Leave the call alone when `param` is passed false (it defaults to moving the weights)."""

    def skip(call: Mapping[str, Any]) -> str | None:
        value = call.get(param, True)
        return None if value else f"{param}={value!r}: {why}"

    skip.__name__ = f"skip_unless_{param}"
    return skip


def _skip_unless_model_params(call: Mapping[str, Any]) -> str | None:
    """ROLL: `include=None` means every state; otherwise the list must name model params."""
    include = call.get("include")
    if include is None:
        return None
    if isinstance(include, str):  # one OffloadStateType (a str Enum) rather than a list of them
        include = (include,)
    try:
        names = {getattr(item, "name", item) for item in include}
        values = {getattr(item, "value", item) for item in include}
    except TypeError:
        names = values = {getattr(include, "name", include)}
    if "model_params" in names or "model_params" in values:
        return None
    return "include names no model_params: the weights stay on the device"


def _skip_unless_weights(call: Mapping[str, Any]) -> str | None:
    """AReaL awex: `tags = tags or ["optimizer", "weights"]`, so an empty list means both too."""
    tags = call.get("tags")
    return None if not tags or "weights" in tags else "tags name no weights: the weights stay on the device"


def _nemo_rl_clears_itself(call: Mapping[str, Any]) -> str | None:
    """NeMo-RL >= 0.7 clears the caches itself when `policy.megatron_cfg.fp8_cfg.force_clear_fp8_caches`
    (read as `self.fp8_cfg.get("force_clear_fp8_caches", False)`, megatron_policy_worker.py @04fc1377)."""
    fp8_cfg = getattr(call.get("self"), "fp8_cfg", None)
    get = getattr(fp8_cfg, "get", None)  # a dict, or an OmegaConf DictConfig
    if callable(get) and get("force_clear_fp8_caches", False):
        return "NeMo-RL fp8_cfg.force_clear_fp8_caches is on: it clears the caches itself"
    return None


def _miles_clears_itself(call: Mapping[str, Any]) -> str | None:
    """miles PR #2142: `--clear-quantized-weight-workspaces-on-offload` (default on)."""
    args = getattr(call.get("self"), "args", None)
    if getattr(args, "clear_quantized_weight_workspaces_on_offload", False):
        return "miles --clear-quantized-weight-workspaces-on-offload is on: it clears the caches itself"
    return None


def _megatron_buffer_modules(buffer: Any) -> Any:
    from te_offload_shim.integrations.megatron import modules_of_buffer

    return modules_of_buffer(buffer)


# --- the table ----------------------------------------------------------------------------------

BUILTIN: tuple[Target, ...] = (
    Target(
        "verl",
        "verl.utils.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        distribution="verl",
        supported=">=0.4.0",
        fixed_in="0.9.0",  # verl PR #6952
        fixed_marker="_clear_te_fp8_weight_workspaces",
    ),
    Target(
        "megatron-core",
        "megatron.core.distributed.param_and_grad_buffer",
        "_ParamAndGradBuffer.offload_to_cpu",
        "self",
        distribution="megatron-core",
        supported=">=0.16.0",  # the method is absent before
        skip=_skip_when_false("move_params", "the weights stay on the device"),
        resolve=_megatron_buffer_modules,  # only the TE layers whose weights live in the buffer
    ),
    Target(
        "nemo-rl",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorkerImpl.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        supported=">=0.6.0",  # offload_after_refit calls it through self
        skip=_nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-0.5",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        # 0.5.x: a @ray.remote class; from 0.6.0 its subclass of the Impl class, whose method it inherits
        supported=">=0.5.0",
        skip=_nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-0.3",
        "nemo_rl.models.policy.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        distribution="nemo-rl",
        supported=">=0.3.0,<0.5.0",
        skip=_nemo_rl_clears_itself,
    ),
    Target(
        "roll",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronInferStrategy.offload_states",
        "self.model.get_models()",
        distribution="roll",
        supported=">=0.1.0,<=0.3.0",
        skip=_skip_unless_model_params,
    ),
    Target(
        "roll-train",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronTrainStrategy.offload_states",  # overrides the Infer method
        "self.model.get_models()",
        distribution="roll",
        supported=">=0.1.0,<=0.3.0",
        skip=_skip_unless_model_params,
    ),
    Target(
        "areal-awex",
        "areal.engine.awex.colocate_writer",
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        distribution="areal",
        note="main since 2026-08-07 (#1500), in no release yet",
        skip=_skip_unless_weights,
    ),
    Target(
        "areal-awex-1.0",
        "areal.experimental.weight_update.awex.megatron_adapter",  # main moved it to areal.engine.awex
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        distribution="areal",
        supported="==1.0.4",
        skip=_skip_unless_weights,
    ),
    Target(
        "areal",
        "areal.engine.megatron_engine",
        "MegatronEngine.offload",  # flushes before torch_memory_saver.pause
        "self.model",
        distribution="areal",
        supported=">=1.0.4",  # main too
    ),
    Target(
        "slime",
        "slime.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        distribution="slime",
        supported=">=0.2.1,<=0.3.1",
    ),
    Target(
        "miles",
        "miles.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        distribution="miles",
        note="git only; from PR #2142 miles clears the caches itself behind a flag (default on)",
        skip=_miles_clears_itself,
    ),
    # ms-swift, SkyRL, RLinf, ChatLearn, Relax: no upstream fix yet, so no skip rule is guessed
    # ahead of one (a fix may come opt-in, like NeMo-RL's, and skipping on its mere presence
    # would bring the leak back). Clearing first is harmless next to an upstream clear: it finds the
    # dict already empty.
    Target(
        "ms-swift",
        "swift.megatron.trainers.utils",
        "offload_megatron_model_to_cpu",  # a copy of verl's pre-fix offload, flushing through swift.utils
        "models",
        distribution="ms-swift",
        supported=">=3.11.0,<=4.6.0",
    ),
    Target(
        "skyrl",
        "skyrl.backends.skyrl_train.distributed.megatron.megatron_utils",
        "offload_megatron_model_to_cpu",  # DDP chunks go through megatron-core's buffer offload, plain ones not
        "models",
        distribution="skyrl",
        supported=">=0.1.0",  # main too
    ),
    Target(
        "skyrl-train",
        "skyrl_train.distributed.megatron.megatron_utils",  # before it became skyrl.backends.skyrl_train
        "offload_megatron_model_to_cpu",
        "models",
        distribution="skyrl-train",
        supported=">=0.2.0,<=0.4.0",
        note="git tags",
    ),
    Target(
        "rlinf",
        "rlinf.hybrid_engines.megatron.megatron_model_manager",
        "MegatronModelManager.offload_model_weights_and_grad",  # MegatronWorker, MegatronSftWorker inherit it
        "self.model",
        distribution="rlinf",
        supported=">=0.1",  # main too
        skip=_skip_when_false("offload_weight", "a grads-only offload leaves the weights and their caches"),
    ),
    Target(
        "chatlearn",
        "chatlearn.models.megatron.memory_manager.trainer",
        "TrainerMemoryManager.offload_weights",  # the caller, TorchModule.offload, flushes after it
        "self._model",
        distribution="pai-chatlearn",
        supported=">=1.2.0",  # main too
    ),
    Target(
        "chatlearn-inference",
        "chatlearn.models.megatron.memory_manager.inference",
        "InferenceMemoryManager.offload_weights",  # reference / reward models, flushed by the same caller
        "self._model",
        distribution="pai-chatlearn",
        supported=">=1.2.0",  # main too
    ),
    Target(
        "relax",
        "relax.backends.megatron.actor",
        "MegatronTrainRayActor.sleep",  # clear_memory, then torch_memory_saver.pause
        "self.model",
        distribution="relax",
        note="main, in no release",
    ),
    Target(
        "relax-selective",
        "relax.backends.megatron.weight_update.train_offload",
        "_SelectiveOffloadStrategy.offload",  # --selective-offload, or no torch_memory_saver
        "self.model",
        distribution="relax",
        note="main since the selective offload, in no release",
    ),
)


def parse_user_targets(text: str) -> tuple[list[Target], list[str]]:
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
