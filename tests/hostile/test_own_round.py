"""Round three, the engineer's own hostile round: what issue 19's changes touch, and what no
guarantee named yet. Each test failed on the code before its fix.

- `discover` over the installed distributions: one distribution with a malformed RECORD (an empty
  line, written by hand or by a broken installer) costs only itself.
- The residue report (and so `TE_OFFLOAD_SHIM_AUDIT`, at every offload) walks the attributes of a
  model's modules: it reads only their types, so a lazily loaded module a model refers to stays
  unloaded, and one attribute whose `__class__` raises costs only itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile_util import cached_layer, load_lazily, write_module

_OFFLOAD = """\
import megatron


def offload_megatron_model_to_cpu(models):
    for buffer in models.buffers:
        buffer.offload_to_cpu()
    torch.cuda.empty_cache()
"""


def _distribution(site: Path, name: str, record: str) -> None:
    """A distribution `name` installed in `site`: one module, `name`.py, and its RECORD."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text(record)
    (site / f"{name}.py").write_text(_OFFLOAD)


@pytest.mark.subprocess()
def test_discover_skips_a_distribution_whose_record_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from te_offload_shim import cli

    site = tmp_path / "site"
    _distribution(site, "broken_record", "broken_record.py,,\n\n,,\n")  # an empty line: importlib raises TypeError
    _distribution(site, "good_record", "good_record.py,,\n")
    saved = list(sys.path)
    sys.path[:] = [str(site)]  # the only distributions this interpreter sees now
    try:
        assert cli.main(["discover", "-v"]) == 0
    finally:
        sys.path[:] = saved
    out, err = capsys.readouterr()
    assert "good_record:offload_megatron_model_to_cpu" in out, out
    skipped = [line for line in err.splitlines() if "broken_record" in line]
    assert len(skipped) == 1 and "skipped" in skipped[0] and "TypeError" in skipped[0], err


@pytest.mark.subprocess()
def test_the_residue_walk_reads_only_types(tmp_path: Path) -> None:
    import builtins

    import torch

    import te_offload_shim as shim

    write_module(tmp_path, "referred_lazily", "import builtins\nbuiltins.REFERRED_LAZILY_RAN = True\n")
    lazy = load_lazily("referred_lazily")

    class Unconfigured:
        @property  # type: ignore[misc]  # deliberately: a __class__ that raises, as Django's LazyObject's
        def __class__(self) -> type:
            raise RuntimeError("settings are not configured")

    layer = torch.nn.Linear(4, 4)
    layer.__dict__["helpers"] = lazy  # a module kept on a layer (a kernel library, lazily imported)
    layer.__dict__["nested"] = {"helpers": lazy}
    layer.__dict__["settings"] = Unconfigured()
    layer.__dict__["weight_copy"] = torch.ones(8)  # a tensor outside parameters and buffers: "other"
    report = shim.residue([layer], device_type="cpu")
    assert not hasattr(builtins, "REFERRED_LAZILY_RAN"), "the report executed a module the application did not"
    assert report.errors == [], report.errors
    assert report.by_category["parameters"] == (16 + 4) * 4
    assert report.by_category["other"] == 8 * 4, "the attributes after the odd one were walked"


_TRAINER = """\
class Trainer:
    def __init__(self, actor, ref):
        self.actor = actor
        self.ref = ref

    def sleep(self):  # offloads both models, each through megatron-core's buffer offload
        for chunks in (self.actor, self.ref):
            for chunk in chunks:
                for buffer in chunk.buffers:
                    buffer.offload_to_cpu()
"""


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "two_models:Trainer.sleep@self.actor"}, timeout=240)
def test_an_outer_wrapper_covers_only_the_chunks_it_cleared(tmp_path: Path) -> None:
    """A user target whose spec names one of the two models its method offloads: the table target
    inside still clears the other one (it was silenced for every chunk)."""
    import te_offload_shim as shim
    from harness import megatron_world as w

    write_module(tmp_path, "two_models", _TRAINER)
    import two_models  # type: ignore[import-not-found]

    def ddp() -> object:
        model = w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32))
        w.attach_fp8_caches(model)
        return model

    actor, ref = [ddp()], [ddp()]
    in_ref = w.cache_state(ref)["entries"]
    two_models.Trainer(actor, ref).sleep()
    assert w.cache_state(actor)["entries"] == 0, "the user's target cleared the model its spec names"
    assert w.cache_state(ref)["entries"] == 0 < in_ref, "megatron-core's buffer offload cleared the other"
    by_target = {k: (v["calls"], v["entries"]) for k, v in shim.stats()["by_target"].items()}
    assert by_target["megatron-core"] == (1, in_ref), "once: the actor's buffer was covered by the outer clearing"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "lazy_target:offload,eager_target:offload"})
def test_status_leaves_a_lazily_loaded_target_module_unloaded(tmp_path: Path) -> None:
    """status() counted our wrappers with vars(module), which runs a LazyLoader module's body."""
    import builtins

    import te_offload_shim as shim

    write_module(tmp_path, "eager_target", "def offload(models):\n    return 'offloaded'\n")
    write_module(
        tmp_path,
        "lazy_target",
        "import builtins\nbuiltins.LAZY_TARGET_RAN = True\n\ndef offload(models):\n    return 1\n",
    )
    import eager_target  # type: ignore[import-not-found]  # noqa: F401  (the patcher is loaded: rows count layers)

    lazy = load_lazily("lazy_target")

    rows = {r["name"]: r for r in shim.status()["targets"]}
    assert not hasattr(builtins, "LAZY_TARGET_RAN"), "status() executed a module the application did not"
    assert (rows["lazy_target:offload"]["state"], rows["lazy_target:offload"]["imported"]) == ("pending", False)
    assert lazy.offload([]) == 1  # the application's own first use runs it
    assert hasattr(builtins, "LAZY_TARGET_RAN")
    row = next(r for r in shim.status()["targets"] if r["name"] == "lazy_target:offload")
    assert (row["state"], row["layers"], row["imported"]) == ("patched", 1, True), row


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.subprocess(timeout=60)
def test_discover_does_not_wait_on_a_named_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A named pipe called x.py in the tree (a tool's socket, a test fixture) blocked the read for good."""
    from te_offload_shim import cli

    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "pipe.py")
    (tree / "plain.py").write_text(_OFFLOAD)
    assert cli.main(["discover", "-v", str(tree)]) == 0
    out, err = capsys.readouterr()
    assert "plain:offload_megatron_model_to_cpu" in out, out
    assert "pipe.py: OSError: not a regular file" in err, err


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "deeply_reloaded:offload"})
def test_reloading_every_module_of_the_package_keeps_the_patches(tmp_path: Path) -> None:
    """A reloader that reloads every module of the package (not only the package itself): the
    registry forgot every patch (uninstall() restored nothing), the wrapper class changed, so status
    saw no wrapper, and a reloaded target was patched by a wrapper no later check recognised."""
    import importlib
    import sys

    import te_offload_shim as shim

    write_module(tmp_path, "deeply_reloaded", "def offload(models):\n    return 'offloaded'\n")
    import deeply_reloaded  # type: ignore[import-not-found]

    layer = cached_layer()
    deeply_reloaded.offload([layer])
    for name in sorted(n for n in sys.modules if n == "te_offload_shim" or n.startswith("te_offload_shim.")):
        module = sys.modules.get(name)  # the package's reload builds its hook's second half anew
        if module is not None:
            importlib.reload(module)

    def row() -> tuple[str, int]:
        found = next(r for r in shim.status()["targets"] if r["name"] == "deeply_reloaded:offload")
        return found["state"], found["layers"]

    assert row() == ("patched", 1)
    assert shim.stats()["calls"] == 1, "the counters outlive the reload"
    importlib.reload(deeply_reloaded)
    assert row() == ("patched", 1), "one wrapper on the reloaded target, recognised as ours"
    layer = cached_layer()
    deeply_reloaded.offload([layer])
    assert layer._fp8_workspaces == {}
    assert shim.uninstall() == 1
    assert type(deeply_reloaded.offload).__name__ == "function", "the original is back"
    assert row() == ("not installed", 0)
