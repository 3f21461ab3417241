"""Trinity-RFT (PyPI `trinity-rft`) is covered through the `verl` entry: the real wheels, in fresh interpreters.

Trinity-RFT has no offload of its own. Its Megatron workers from-import verl's
`offload_megatron_model_to_cpu` and call the bare name: `trinity.trainer.verl.megatron_workers` in
0.3.0 - 0.5.2 (0.5.2 pins verl 0.7.1), `trinity.trainer.verl_legacy.megatron_workers` in 0.6.0, used
there with verl < 0.8 (`trinity.trainer.trainer.is_verl_legacy`; with verl >= 0.8 it runs verl's own
engine workers, which tests/test_verl.py covers). So the `verl` entry must reach Trinity-RFT's alias,
whichever was imported first.

The wheels sit in `.deps/trinity-rft-X`, what the workers import beyond the test venv in
`.deps/trinity-pydeps` (scripts/setup-env.sh). The workers module does a bare `import vllm` for its
side effect on NCCL's settings; vllm's wheels are CUDA builds, and the offload never calls it, so
the import-only stand-in of harness/te_import_only.py serves it. The model and its verl offload are
tests/support/verl_case.py's, with verl 0.7.1 on the path.
"""

from __future__ import annotations

import importlib
import sys

import pytest
from conftest import DEPS
from support.set_up import needs
from support.verl_case import build, offload

WORKERS = {"0.6.0": "trinity.trainer.verl_legacy.megatron_workers", "0.5.2": "trinity.trainer.verl.megatron_workers"}


def _on_path(release: str) -> str:
    folder = DEPS / f"trinity-rft-{release}"
    needs(folder / "trinity", f"trinity-rft {release} not installed in {folder}")
    sys.path[:0] = [str(folder), str(DEPS / "trinity-pydeps")]
    from harness import te_import_only

    te_import_only.serve("vllm")
    return WORKERS[release]


def _check(r: dict, caller: str, release: str) -> None:
    from importlib.metadata import version

    assert version("trinity-rft") == release and version("verl") == "0.7.1"
    assert r["initial"]["entries"] == 9 and r["initial"]["bytes"] > 0
    assert r["flushes"] == [0], "the caches must be gone before verl's own allocator flush"
    assert r["after"] == {"entries": 0, "bytes": 0}
    assert r["caller_layers"] == 1 and r["module_layers"] == 1, f"{caller}'s from-imported name is the wrapper"
    verl_utils = sys.modules["verl.utils.megatron_utils"]
    assert sys.modules[caller].offload_megatron_model_to_cpu is verl_utils.offload_megatron_model_to_cpu
    assert r["offloaded"] and r["same"], "verl offloaded, and the weights came back bit-identical"
    per = {"calls": 1, "entries": 9, "bytes": r["initial"]["bytes"], "primary_weight_cleared": 0}
    assert r["stats"]["by_target"] == {"verl": per}
    assert r["state"]["verl"] == "patched"


@pytest.mark.subprocess(verl="0.7.1", timeout=240)
def test_trinity_0_6_legacy_workers_imported_before_the_shim_are_rebound() -> None:
    caller = _on_path("0.6.0")
    importlib.import_module(caller)
    world = build()
    assert "te_offload_shim" not in sys.modules
    import te_offload_shim  # noqa: F401  (installs: patches verl's module, rebinds Trinity-RFT's alias)

    _check(offload(world, caller), caller, "0.6.0")


@pytest.mark.subprocess(verl="0.7.1", timeout=240)
def test_trinity_0_5_workers_imported_after_the_shim() -> None:
    import te_offload_shim  # noqa: F401

    caller = _on_path("0.5.2")
    importlib.import_module(caller)
    _check(offload(build(), caller), caller, "0.5.2")
