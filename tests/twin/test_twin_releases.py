"""Which TE releases the twin runs (harness/te_twin/cells.py TWIN_RELEASES: every 2.x release the
class probe installs), and why it does not run TE 1.x."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from support.set_up import needs

from harness import te_releases


def test_the_twin_runs_every_2x_release_the_class_probe_installs() -> None:
    from harness.te_twin.cells import NOT_TWINNED, TWIN_RELEASES

    releases_2x = {r for r in te_releases.RELEASES if te_releases.key(r) >= (2, 0)}
    assert set(TWIN_RELEASES) == releases_2x
    assert set(NOT_TWINNED) | releases_2x | {"1.9.0"} == set(te_releases.RELEASES)


def _python_of(release: str) -> str:
    needs(te_releases.installed(release), f"TE {release} not in {te_releases.folder(release)}")
    root = te_releases.folder(release) / "transformer_engine" / "pytorch"
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.py")))


def test_te_1x_is_not_twinned_for_the_reason_it_gives() -> None:
    """The reason NOT_TWINNED gives, read in the wheels (it was a skip that always skipped): TE
    1.13's Python calls TorchScript ops and 1.x extension functions that TE 2.20.2's no longer names
    (the twin implements 2.x's extension), and imports `torch.onnx._type_utils`, which this torch
    does not have."""
    from harness.te_twin.cells import NOT_TWINNED

    reason = NOT_TWINNED["1.13.0"]
    old, new = _python_of("1.13.0"), _python_of("2.20.2")
    for name in ("torch.ops.tex_ts", "te_gemm_ts", "cast_to_fp8_ts", "gelu_ts", "fused_cast_transpose_noop",
                 "layernorm_fwd_fp8"):  # fmt: skip
        assert name in reason and name in old and name not in new, name
    assert "from torch.onnx import _type_utils" in old and "torch.onnx._type_utils" in reason
    torch_spec = importlib.util.find_spec("torch")  # not imported: where it lies is enough
    assert torch_spec is not None and torch_spec.origin is not None
    assert not (Path(torch_spec.origin).parent / "onnx" / "_type_utils.py").exists()
