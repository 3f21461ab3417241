"""One case per entry of the target table (`BUILTIN`): how its framework calls the entry point, on
which chunks, which of the framework's own flushes must find the caches gone, and what differs from
entry to entry (other ways to pass the arguments, the calls its skip rule leaves alone, a reload).

tests/integrations/test_frameworks.py::test_contract runs every case in a fresh interpreter, and
tests/engine/test_import_order.py takes each case's `call` through both import orders; a table entry
without a case fails tests/engine/test_import_order.py::test_every_builtin_entry_has_a_row. So a new
entry of the table is a new `Case` here, a few lines, plus a test of its own only for what no field
below can say.

The frameworks that do not import on a CPU-only machine are mirrors (tests/mirrors/, each citing its
upstream file and commit), whose flushes record what is still cached (tests/mirrors/mirror_flush.py);
verl, megatron-core, ms-swift and siiRL are the real packages, whose flushes their own tests observe
(tests/integrations/test_verl.py, test_megatron_buffer.py, test_ms_swift.py, test_siirl.py). Imports nothing heavy at
its top: the fresh interpreters import it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

from conftest import DEPS, use_mirrors

from support import siirl_case

# The framework's own call of the entry point, on these chunks, as it makes it: returns the object it
# built (the worker, strategy, manager), for a reload.
Call = Callable[[ModuleType, list], Any]
# Puts the weights back after `call`; returns the chunks whose weights must then be bit-identical.
Reload = Callable[[ModuleType, Any, list], list]

SWIFT = DEPS / "ms-swift-4.6.0"


@dataclass(frozen=True)
class LeftAlone:
    """A call that the entry's skip rule leaves alone, and the reason it is counted under."""

    call: Call
    reason: str
    clears_itself: bool = False  # the framework clears the caches itself on that call (its flushes see none)


@dataclass(frozen=True)
class Case:
    call: Call
    chunks: tuple[str, ...] = ("ddp",)  # "ddp": megatron DDP over a GPTModel; "plain": the GPTModel alone
    flushes: tuple[str, ...] = ("flush",)  # the flush events of one call (mirror_flush), in order; () when real
    variants: tuple[Call, ...] = ()  # more calls that must clear: the other ways to pass the arguments
    left_alone: tuple[LeftAlone, ...] = ()
    reload: Reload | None = None
    prepare: Callable[[], None] = use_mirrors  # what goes on the path before the target module is imported
    check: Callable[[ModuleType], None] | None = None  # what else the module must be, for the rules above
    subprocess: Mapping[str, Any] = field(default_factory=dict)  # the fresh interpreter's `subprocess` marker
    needs: str | None = None  # a folder of .deps the case runs from: skipped, with the reason, when absent


def _method(make: Callable[[ModuleType, list], Any], name: str, *args: Any, **kwargs: Any) -> Call:
    """Build the framework's object from the module and the chunks, then call its offload method."""

    def call(module: ModuleType, chunks: list) -> Any:
        made = make(module, chunks)
        getattr(made, name)(*args, **kwargs)
        return made

    return call


def _function(module: ModuleType, chunks: list) -> None:
    module.offload_megatron_model_to_cpu(chunks)


def _all(reload: Callable[[Any], None]) -> Reload:
    """A reload through the object the call built; every chunk's weights must be back."""

    def back(module: ModuleType, made: Any, chunks: list) -> list:
        reload(made)
        return chunks

    return back


# --- verl, megatron-core (real) --------------------------------------------------------------------


def _verl_reload(module: ModuleType, made: Any, chunks: list) -> list:
    module.load_megatron_model_to_gpu(chunks)
    return chunks


def _buffer_offload(module: ModuleType, chunks: list, **kwargs: Any) -> None:
    for buffer in chunks[0].buffers:
        buffer.offload_to_cpu(**kwargs)


def _buffer_reload(module: ModuleType, made: Any, chunks: list) -> list:
    for buffer in chunks[0].buffers:
        buffer.reload_from_cpu()
    return chunks


# --- NeMo-RL -------------------------------------------------------------------------------------


def _nemo_rl_impl(fp8_cfg: dict | None = None, method: str = "offload_before_refit") -> Call:
    config = {"megatron_cfg": {} if fp8_cfg is None else {"fp8_cfg": fp8_cfg}}
    return _method(lambda m, chunks: m.MegatronPolicyWorkerImpl(chunks[0], config), method)


def _nemo_rl_reload(module: ModuleType, worker: Any, chunks: list) -> list:
    worker.move_model(worker.model, "cuda")
    return chunks


# What the actor process instantiates: the @ray.remote class's modified class.
_nemo_rl_remote = _method(
    lambda m, chunks: m.MegatronPolicyWorker.__ray_metadata__.modified_class(chunks[0], {"megatron_cfg": {}}),
    "offload_before_refit",
)

# --- ROLL: `include` is a list, a set or one OffloadStateType (a str Enum), or None for every state -------


def _states(*names: str, kind: str = "list") -> Callable[[], Any]:
    def include() -> Any:
        from roll.utils.offload_states import OffloadStateType

        members = [OffloadStateType[n] for n in names]
        return {"list": members, "set": set(members), "one": members[0]}[kind]

    return include


def _roll(cls: str, include: Callable[[], Any] | None, keyword: bool) -> Call:
    def call(module: ModuleType, chunks: list) -> Any:
        strategy = getattr(module, cls)(chunks)
        value = None if include is None else include()
        if keyword:
            strategy.offload_states(include=value)
        else:
            strategy.offload_states(value)
        return strategy

    return call


def _roll_case(cls: str, keyword: bool) -> Case:
    clearing = (
        _states("model_params"),
        _states("model_params", "optimizer_states", kind="set"),
        _states("model_params", kind="one"),
    )
    return Case(
        _roll(cls, None, keyword),
        chunks=("ddp", "ddp"),  # two virtual-pipeline chunks
        variants=tuple(_roll(cls, include, keyword) for include in clearing),
        left_alone=(
            LeftAlone(
                _roll(cls, _states("optimizer_states", "other_params"), keyword),
                "include names no model_params: the weights stay on the device",
            ),
        ),
        check=_roll_state_type_is_a_str_enum,
    )


def _roll_state_type_is_a_str_enum(module: ModuleType) -> None:
    """The skip rule reads one OffloadStateType as a str; ROLL's is a str Enum (roll/utils/offload_states.py)."""
    from enum import Enum

    from roll.utils.offload_states import OffloadStateType

    assert issubclass(OffloadStateType, str) and issubclass(OffloadStateType, Enum)


# --- AReaL: awex `tags` None or empty means both, AReaL 1.0.4 is called positionally -------------------


def _awex(tags: list[str] | None, keyword: bool) -> Call:
    def call(module: ModuleType, chunks: list) -> Any:
        adapter = module.AwexMegatronAdapter(SimpleNamespace(model=chunks))
        if keyword:
            adapter.release_memory(tags=tags)
        else:
            adapter.release_memory(tags)
        return adapter

    return call


def _awex_case(keyword: bool) -> Case:
    return Case(
        _awex(None, keyword=True),
        chunks=("ddp", "ddp"),
        variants=tuple(_awex(tags, keyword) for tags in (None, [], ["weights"])),
        left_alone=(LeftAlone(_awex(["optimizer"], keyword), "tags name no weights: the weights stay on the device"),),
    )


# --- slime, miles: Megatron-LM style args (miles clears itself only under TE without CUDA graphs) ------

_ARGS = {"offload_train": True, "transformer_impl": "transformer_engine", "cuda_graph_impl": "none"}
_MILES_FLAG = "clear_quantized_weight_workspaces_on_offload"  # miles PR #2142, default on


def _actor(**args: Any) -> Call:
    return _method(lambda m, chunks: m.MegatronTrainRayActor(SimpleNamespace(**_ARGS, **args), chunks), "sleep")


# --- ms-swift (real, with Transformer Engine's import-only stand-in) --------------------------------


def prepare_ms_swift() -> None:
    """megatron-core modules choose TE or their own layers when first imported: the ones the test
    model uses are imported while TE is absent; its TE wrappers module is then dropped so that
    ms-swift loads it again against the import-only stand-in (tests/integrations/test_ms_swift.py)."""
    import megatron.core.distributed
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401

    from harness import te_import_only

    for name in [m for m in sys.modules if m.startswith("megatron.core.extensions")]:
        del sys.modules[name]
    sys.path[:0] = [str(SWIFT), str(DEPS / "triton")]
    te_import_only.install()


# --- siiRL (real: tests/support/siirl_case.py) -------------------------------------------------------


def _siirl(release: str) -> Callable[[], None]:
    return lambda: siirl_case.on_path(release)


def _siirl_reward(module: ModuleType, chunks: list) -> Any:
    """The Megatron reward model siiRL's RewardModelWorker builds (plain chunks), with
    `megatron.param_offload` off at construction, then its offload as `compute_reward` calls it."""
    config = SimpleNamespace(megatron=SimpleNamespace(param_offload=False))
    made = module.MegatronRewardModel(
        config=config, model_config=None, reward_model_module=chunks, hf_config=None, tf_config=None
    )
    made.offload_params_to_cpu()
    return made


def _siirl_reward_case(release: str) -> Case:
    return Case(
        _siirl_reward,
        chunks=("plain",),
        flushes=(),
        prepare=_siirl(release),
        reload=_all(lambda reward_model: reward_model.load_params_to_cuda()),
        needs=f"siirl-{release}",
    )


# --- SkyRL, RLinf, ChatLearn -------------------------------------------------------------------------


def _skyrl_reload(module: ModuleType, made: Any, chunks: list) -> list:
    module.load_megatron_model_to_gpu(chunks[:1])  # the DDP chunk; the plain one stays on the CPU
    return chunks[:1]


def _rlinf(**kwargs: Any) -> Call:
    return _method(lambda m, chunks: m.MegatronModelManager(chunks), "offload_model_weights_and_grad", **kwargs)


def _chatlearn(make: Callable[[ModuleType, list], Any]) -> Call:
    """ChatLearn's offload_weights does not flush: its caller, TorchModule.offload, flushes after it."""

    def call(module: ModuleType, chunks: list) -> Any:
        import mirror_flush

        manager = make(module, chunks)
        manager.offload_weights()
        mirror_flush.empty_cache(chunks)
        return manager

    return call


# --- the cases, by entry name ----------------------------------------------------------------------

CASES: dict[str, Case] = {
    "verl": Case(_function, flushes=(), reload=_verl_reload, subprocess={"verl": "0.8.0"}),
    "megatron-core": Case(
        _buffer_offload,
        flushes=(),  # the buffer offload does not flush: its callers do
        left_alone=(
            LeftAlone(
                lambda m, chunks: _buffer_offload(m, chunks, move_params=False),
                "move_params=False: the weights stay on the device",
            ),
        ),
        reload=_buffer_reload,
    ),
    "nemo-rl": Case(
        _nemo_rl_impl(),
        left_alone=(
            LeftAlone(
                _nemo_rl_impl({"force_clear_fp8_caches": True}),
                "NeMo-RL fp8_cfg.force_clear_fp8_caches is on: it clears the caches itself",
                clears_itself=True,
            ),
        ),
        variants=(_nemo_rl_impl({"force_clear_fp8_caches": False}),),
        reload=_nemo_rl_reload,
    ),
    # Through the 0.6+ mirror, where offload_after_refit still calls offload_before_refit (which then
    # finds its chunk cleared); PR #2248's layout, and the opt-in clear's call (inside which megatron-core's
    # buffer offload still clears, as it did before this entry), have a test of their own:
    # tests/integrations/test_frameworks.py::test_nemo_rl_offload_after_refit_with_and_without_pr_2248.
    "nemo-rl-after-refit": Case(
        _nemo_rl_impl(method="offload_after_refit"),
        variants=(_nemo_rl_impl({"force_clear_fp8_caches": False}, method="offload_after_refit"),),
        reload=_nemo_rl_reload,
    ),
    "nemo-rl-0.5": Case(_nemo_rl_remote, prepare=lambda: use_mirrors("nemo_rl_v0_5")),
    "nemo-rl-0.3": Case(_nemo_rl_remote),
    "roll": _roll_case("MegatronInferStrategy", keyword=False),
    "roll-train": _roll_case("MegatronTrainStrategy", keyword=True),
    "areal-awex": _awex_case(keyword=True),
    "areal-awex-1.0": _awex_case(keyword=False),
    "areal": Case(
        _method(lambda m, chunks: m.MegatronEngine(chunks), "offload"),
        flushes=("flush", "pause"),  # current_platform.clear_memory(), torch_memory_saver.pause()
        chunks=("ddp", "ddp"),
        # disable_grad_buffers_cpu_backup: the grad buffers go through offload_grad_buffers first
        variants=(_method(lambda m, c: m.MegatronEngine(c, disable_grad_buffers_cpu_backup=True), "offload"),),
    ),
    "slime": Case(_actor(), chunks=("ddp", "ddp"), flushes=("flush", "pause")),
    "miles": Case(
        _actor(**{_MILES_FLAG: False}),
        chunks=("ddp", "ddp"),
        flushes=("flush", "pause"),
        variants=(_actor(),),  # before PR #2142: no such flag
        left_alone=(
            LeftAlone(
                _actor(**{_MILES_FLAG: True}),
                "miles --clear-quantized-weight-workspaces-on-offload is on: it clears the caches itself",
                clears_itself=True,
            ),
        ),
    ),
    "ms-swift": Case(
        _function,
        chunks=("ddp", "plain"),  # the policy in DDP, the reference model plain (ms-swift's `else` branch)
        flushes=(),
        prepare=prepare_ms_swift,
        subprocess={"timeout": 300},
        needs="ms-swift-4.6.0",
    ),
    # SkyRL's DDP chunks go through megatron-core's buffer offload (itself a target, whose call must not
    # count again); its reference model is a plain chunk (tests/integrations/test_frameworks.py says why).
    "skyrl": Case(_function, chunks=("ddp", "plain"), reload=_skyrl_reload),
    "skyrl-train": Case(_function, chunks=("ddp", "plain")),
    "rlinf": Case(
        _rlinf(),
        chunks=("ddp", "ddp"),
        left_alone=(
            LeftAlone(
                _rlinf(offload_weight=False),
                "offload_weight=False: a grads-only offload leaves the weights and their caches",
            ),
        ),
        reload=_all(lambda manager: manager.onload_model_weights_and_grad()),
    ),
    "chatlearn": Case(
        _chatlearn(lambda m, chunks: m.TrainerMemoryManager(chunks, None)),
        reload=_all(lambda manager: manager.onload_weights()),
    ),
    "chatlearn-inference": Case(_chatlearn(lambda m, chunks: m.InferenceMemoryManager(chunks)), chunks=("plain",)),
    "siirl": Case(
        _function,
        chunks=("ddp", "plain"),  # the actor in DDP, the reference model plain (siiRL's `else` branch)
        flushes=(),
        prepare=_siirl("0.2.0"),
        reload=_verl_reload,  # siiRL's copy of verl's reload, the same name and signature
        needs="siirl-0.2.0",
    ),
    "siirl-reward": _siirl_reward_case("0.2.0"),
    "siirl-reward-0.1": _siirl_reward_case("0.1.0.post1"),
    "relax": Case(
        _method(lambda m, chunks: m.MegatronTrainRayActor(SimpleNamespace(offload_train=True), chunks), "sleep"),
        chunks=("ddp", "ddp"),
        flushes=("flush", "pause"),  # clear_memory, then torch_memory_saver.pause
    ),
    "relax-selective": Case(
        _method(lambda m, chunks: m._SelectiveOffloadStrategy(chunks, None, SimpleNamespace()), "offload"),
        reload=_all(lambda strategy: strategy.reload()),
    ),
}
