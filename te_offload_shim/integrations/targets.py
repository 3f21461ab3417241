"""WHAT to patch: one declarative entry per framework entry point.

Adding a target is adding an entry to `BUILTIN`. An entry names the module to watch, the attribute
(`func` or `Class.method`), where the model chunks are in a call (a `where` spec), the
releases it applies to, and optionally a rule that leaves a call alone. The other four steps (the
module name in `__init__.BUILTIN_MODULES`, a mirror or a real release, the `Case` in
tests/support/entries.py, the row in docs/frameworks.md) and how to run the entry's contract are in
docs/contributing.md, on one page.

An entry is an `engine.schema.Target`; its `where` spec (where the model chunks are in a call) is
described there, and is shared with `TE_OFFLOAD_SHIM_TARGETS`. This module is data only: the skip
rules and resolvers the entries name are in integrations/rules.py.

Releases, declared once per entry and read by `te-offload-shim status` (integrations/versions.py):
- `requires`: a requirement string, `verl>=0.4.0,<0.9.0`: the distribution (the package whose
  installed version is checked), then a version specifier set for the releases in which the entry
  point exists as the entry describes it (a PEP 440 specifier set, matched with `packaging`; read as
  the target's `distribution` and `supported`). The distribution alone when no release number is
  known for it (git-only code, or code in no release yet); `note` then says which revisions have it.
  A release outside the set is a warning in `status`, never a reason not to patch: the shim patches
  what it finds.
- `fixed_in`: the first release that clears the caches itself; from it on the entry is left alone.
  `fixed_marker` is the module attribute that fix added: at run time its presence, not the version
  number, decides (a back-port or a git checkout carries the fix under any number), and a test checks
  that the two agree on the real releases (tests/integrations/test_target_table.py, tests/integrations/test_verl.py).
- `note`: only what the specifier cannot say.

`skip`: a rule (integrations/rules.py) that says why a call is left alone, or None to clear.

Not read at start-up: `import te_offload_shim` watches the module names written out in
`__init__.BUILTIN_MODULES` (tests/startup/test_layout.py keeps the two in step), and the table is imported
when one of them is. The specifiers are strings here, parsed only by `status` and the tests.
"""

from __future__ import annotations

from te_offload_shim.engine.schema import Target
from te_offload_shim.integrations import rules

__all__ = ["BUILTIN", "Target"]

# --- the table ----------------------------------------------------------------------------------

BUILTIN: tuple[Target, ...] = (
    Target(
        "verl",
        "verl.utils.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        requires="verl>=0.4.0",
        fixed_in="0.9.0",  # verl PR #6952
        fixed_marker="_clear_te_fp8_weight_workspaces",
    ),
    Target(
        "megatron-core",
        "megatron.core.distributed.param_and_grad_buffer",
        "_ParamAndGradBuffer.offload_to_cpu",
        "self",
        requires="megatron-core>=0.16.0",  # the method is absent before
        skip=rules.skip_when_false("move_params", "the weights stay on the device"),
        resolve=rules.megatron_buffer_modules,  # only the TE layers whose weights live in the buffer
    ),
    Target(
        "nemo-rl",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorkerImpl.offload_before_refit",
        "self.model",
        requires="nemo-rl>=0.6.0",  # offload_after_refit calls it through self
        skip=rules.nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-after-refit",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        # Open PR #2248 inlines it: it would no longer call offload_before_refit. Where it still does,
        # the inner call finds its chunk cleared by this one (nesting) and clears nothing twice.
        "MegatronPolicyWorkerImpl.offload_after_refit",
        "self.model",
        requires="nemo-rl>=0.6.0",
        skip=rules.nemo_rl_clears_itself,  # the PR keeps the opt-in clear, in _clear_refit_memory_caches
    ),
    Target(
        "nemo-rl-0.5",
        "nemo_rl.models.policy.workers.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        # 0.5.x: a @ray.remote class; from 0.6.0 its subclass of the Impl class, whose method it inherits
        requires="nemo-rl>=0.5.0",
        skip=rules.nemo_rl_clears_itself,
    ),
    Target(
        "nemo-rl-0.3",
        "nemo_rl.models.policy.megatron_policy_worker",
        "MegatronPolicyWorker.offload_before_refit",
        "self.model",
        requires="nemo-rl>=0.3.0,<0.5.0",
        skip=rules.nemo_rl_clears_itself,
    ),
    Target(
        "roll",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronInferStrategy.offload_states",
        "self.model.get_models()",
        requires="roll>=0.1.0,<=0.3.0",
        skip=rules.skip_unless_model_params,
    ),
    Target(
        "roll-train",
        "roll.distributed.strategy.megatron_strategy",
        "MegatronTrainStrategy.offload_states",  # overrides the Infer method
        "self.model.get_models()",
        requires="roll>=0.1.0,<=0.3.0",
        skip=rules.skip_unless_model_params,
    ),
    Target(
        "areal-awex",
        "areal.engine.awex.colocate_writer",
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        requires="areal",
        note="main since 2026-08-07 (#1500), in no release yet",
        skip=rules.skip_unless_weights,
    ),
    Target(
        "areal-awex-1.0",
        "areal.experimental.weight_update.awex.megatron_adapter",  # main moved it to areal.engine.awex
        "AwexMegatronAdapter.release_memory",
        "self._engine.model",
        requires="areal==1.0.4",
        skip=rules.skip_unless_weights,
    ),
    Target(
        "areal",
        "areal.engine.megatron_engine",
        "MegatronEngine.offload",  # flushes before torch_memory_saver.pause
        "self.model",
        requires="areal>=1.0.4",  # main too
    ),
    Target(
        "slime",
        "slime.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        requires="slime>=0.2.1,<=0.3.1",
    ),
    Target(
        "miles",
        "miles.backends.megatron_utils.actor",
        "MegatronTrainRayActor.sleep",
        "self.model",
        requires="miles",
        note="git only; from PR #2142 miles clears the caches itself behind a flag (default on)",
        skip=rules.miles_clears_itself,
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
        requires="ms-swift>=3.11.0,<=4.6.0",
    ),
    Target(
        "skyrl",
        "skyrl.backends.skyrl_train.distributed.megatron.megatron_utils",
        "offload_megatron_model_to_cpu",  # DDP chunks go through megatron-core's buffer offload, plain ones not
        "models",
        requires="skyrl>=0.1.0",  # main too
    ),
    Target(
        "skyrl-train",
        "skyrl_train.distributed.megatron.megatron_utils",  # before it became skyrl.backends.skyrl_train
        "offload_megatron_model_to_cpu",
        "models",
        requires="skyrl-train>=0.2.0,<=0.4.0",
        note="git tags",
    ),
    Target(
        "rlinf",
        "rlinf.hybrid_engines.megatron.megatron_model_manager",
        "MegatronModelManager.offload_model_weights_and_grad",  # MegatronWorker, MegatronSftWorker inherit it
        "self.model",
        requires="rlinf>=0.1",  # main too
        skip=rules.skip_when_false("offload_weight", "a grads-only offload leaves the weights and their caches"),
    ),
    Target(
        "chatlearn",
        "chatlearn.models.megatron.memory_manager.trainer",
        "TrainerMemoryManager.offload_weights",  # the caller, TorchModule.offload, flushes after it
        "self._model",
        requires="pai-chatlearn>=1.2.0",  # main too
    ),
    Target(
        "chatlearn-inference",
        "chatlearn.models.megatron.memory_manager.inference",
        "InferenceMemoryManager.offload_weights",  # reference / reward models, flushed by the same caller
        "self._model",
        requires="pai-chatlearn>=1.2.0",  # main too
    ),
    # siiRL's offload is a copy of verl's pre-fix one, the same function from v0.0.1 to v0.2.0
    # (c3ecc6a7) and main (af00a77): it empties the DDP buffers' storage itself, never through
    # megatron-core's buffer offload, so the megatron-core entry does not fire for it. Its workers
    # (`siirl.engine.megatron_workers`, `siirl.workers.megatron_workers` before 0.2.0) and sharding
    # managers from-import it.
    Target(
        "siirl",
        "siirl.utils.megatron.megatron_utils",
        "offload_megatron_model_to_cpu",
        "models",
        requires="siirl>=0.0.1",  # main too
    ),
    Target(
        "siirl-reward",
        "siirl.engine.reward_model.megatron.reward_model",
        "MegatronRewardModel.offload_params_to_cpu",  # `megatron.param_offload` of a Megatron reward model
        "self.reward_model_module",
        requires="siirl>=0.2.0",  # main too
    ),
    Target(
        "siirl-reward-0.1",
        "siirl.workers.reward_model.megatron.reward_model",  # 0.2.0 renamed siirl.workers to siirl.engine
        "MegatronRewardModel.offload_params_to_cpu",
        "self.reward_model_module",
        requires="siirl>=0.0.1,<0.2.0",
    ),
    Target(
        "relax",
        "relax.backends.megatron.actor",
        "MegatronTrainRayActor.sleep",  # clear_memory, then torch_memory_saver.pause
        "self.model",
        requires="relax",
        note="main, in no release",
    ),
    Target(
        "relax-selective",
        "relax.backends.megatron.weight_update.train_offload",
        "_SelectiveOffloadStrategy.offload",  # --selective-offload, or no torch_memory_saver
        "self.model",
        requires="relax",
        note="main since the selective offload, in no release",
    ),
)
