"""The shim on the real ms-swift 4.6.0 (PyPI `ms-swift`), in one fresh interpreter.

`swift.megatron.trainers.utils.offload_megatron_model_to_cpu(models)` is a copy of verl's pre-fix
offload; `swift.megatron.trainers.rollout_mixin` (the GRPO / GKD trainers' mixin) from-imports it. The
package and what its Megatron trainers need to import sit in `.deps/ms-swift-4.6.0`
(scripts/setup-env.sh). `mcore_bridge` imports Transformer Engine at its top, so TE is served by the
import-only stand-in (harness/te_import_only.py): the offload never calls TE. The model is the real
megatron-core GPTModel in megatron DDP that the verl tests use, with TE-layout caches.
"""

from __future__ import annotations

import pytest
from conftest import DEPS
from support.set_up import missing

SWIFT = DEPS / "ms-swift-4.6.0"

pytestmark = [] if (SWIFT / "swift").is_dir() else [missing(f"ms-swift 4.6.0 not installed in {SWIFT}")]


@pytest.mark.subprocess(timeout=300)
def test_ms_swift_offload_leaves_no_cache() -> None:
    import sys

    import te_offload_shim as shim  # first, as a user would

    assert "swift" not in sys.modules and "megatron.core" not in sys.modules
    # megatron-core modules choose TE or their own layers when first imported: import the ones the
    # test model uses while TE is absent, as on a machine without TE.
    import megatron.core.distributed
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401

    from harness import megatron_world as w
    from harness import te_import_only

    # ...but megatron's TE wrappers module, loaded on the way without TE, holds None for its classes:
    # drop it, so that ms-swift's import loads it again against the stand-in, as on a TE machine.
    for name in [m for m in sys.modules if m.startswith("megatron.core.extensions")]:
        del sys.modules[name]
    sys.path.insert(0, str(SWIFT))
    sys.path.insert(1, str(DEPS / "triton"))  # mcore_bridge imports triton (set up once, shared with TE's tests)

    te_import_only.install()
    from swift.megatron.trainers import rollout_mixin
    from swift.megatron.trainers import utils as swift_utils

    assert "/ms-swift-4.6.0/" in swift_utils.__file__
    from importlib.metadata import version

    assert version("ms-swift") == "4.6.0"

    trained = w.wrap_ddp(w.build_gpt())  # the policy: megatron DDP over its param/grad buffers
    reference = w.build_gpt()  # the reference model: a plain chunk, ms-swift's `else` branch
    models = [trained, reference]
    for model in models:
        w.attach_fp8_caches(model)
    initial = w.cache_state(models)
    before = [w.weights(m) for m in models]
    flushes: list[int] = []
    # ms-swift's own flush, `empty_cache()` from swift.utils, looked up in the module at call time
    swift_utils.empty_cache = lambda: flushes.append(w.cache_state(models)["entries"])

    assert rollout_mixin.offload_megatron_model_to_cpu is swift_utils.offload_megatron_model_to_cpu
    rollout_mixin.offload_megatron_model_to_cpu(models)  # the caller's own from-imported name

    assert initial["entries"] == 18 and initial["bytes"] > 0
    assert flushes == [0], "the caches must be gone before ms-swift's own allocator flush"
    assert w.cache_state(models) == {"entries": 0, "bytes": 0}
    assert all(b.param_data.untyped_storage().size() == 0 for b in trained.buffers), "ms-swift really offloaded"
    stats = shim.stats()
    per = {"calls": 1, "entries": 18, "bytes": initial["bytes"], "primary_weight_cleared": 0}
    assert stats["by_target"] == {"ms-swift": per}
    state = {t["name"]: t["state"] for t in shim.status()["targets"]}
    assert state["ms-swift"] == "patched"

    swift_utils.load_megatron_model_to_gpu(models)
    after = [w.weights(m) for m in models]
    assert all(w.same_weights(b, a) for b, a in zip(before, after, strict=True)), "weights round-trip bit-identical"
