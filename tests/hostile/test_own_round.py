"""Round three, the engineer's own hostile round: what issue 19's changes touch, and what no
guarantee named yet. Each test failed on the code before its fix.

- `discover` over the installed distributions: one distribution with a malformed RECORD (an empty
  line, written by hand or by a broken installer) costs only itself.
- The residue report (and so `TE_OFFLOAD_SHIM_AUDIT`, at every offload) walks the attributes of a
  model's modules: it reads only their types, so a lazily loaded module a model refers to stays
  unloaded, and one attribute whose `__class__` raises costs only itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_util import write_module

RUNXFAIL = ("--runxfail",)

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
    import importlib.util
    import sys

    import torch

    import te_offload_shim as shim

    write_module(tmp_path, "referred_lazily", "import builtins\nbuiltins.REFERRED_LAZILY_RAN = True\n")
    spec = importlib.util.find_spec("referred_lazily")
    assert spec is not None and spec.loader is not None
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    lazy = importlib.util.module_from_spec(spec)
    sys.modules["referred_lazily"] = lazy
    loader.exec_module(lazy)

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
