"""The demo's choice of mode (harness/demo_mode.py): TE's real kernels on a CUDA GPU where TE's compiled
extension imports, the twin on a CPU machine with the TE wheel set up, stand-ins otherwise; and a
forced mode this machine cannot give is refused with the reason."""

from __future__ import annotations

import pytest

from harness import demo_mode as mode


@pytest.mark.parametrize(
    ("cuda", "extension", "wheel", "expected"),
    [
        (True, None, True, "te"),
        (True, None, False, "te"),  # the twin's wheel does not matter where TE really runs
        (True, "transformer_engine_torch is not installed", True, "standins"),  # the twin cannot share a GPU process
        (False, "no CUDA GPU", True, "twin"),
        (False, "no CUDA GPU", False, "standins"),
    ],
)
def test_the_mode_follows_the_machine(cuda: bool, extension: str | None, wheel: bool, expected: str) -> None:
    chosen = mode.choose(mode.Facts(cuda=cuda, te_extension=extension, twin_release_installed=wheel))
    assert chosen.name == expected
    if extension and cuda:
        assert extension in chosen.why


def test_a_forced_mode_the_machine_cannot_give_is_refused_with_the_reason() -> None:
    facts = mode.Facts(cuda=False, te_extension="no CUDA GPU", twin_release_installed=True)
    assert mode.choose(facts, "twin").name == "twin"
    with pytest.raises(RuntimeError, match="--mode te is not possible here: this machine gives 'twin'"):
        mode.choose(facts, "te")


def test_this_cpu_machine_reads_as_twin_and_no_extension() -> None:
    """facts() on this machine: torch sees no GPU, so TE's extension is not looked at."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    found = mode.facts("2.20.2")
    assert (found.cuda, found.te_extension) == (False, "no CUDA GPU")
    assert mode.choose(found).name == ("twin" if found.twin_release_installed else "standins")


def test_te_extension_error_names_a_missing_extension() -> None:
    """On this machine no `transformer_engine_torch` is installed (the twin provides it only inside
    its own processes)."""
    import importlib.util

    if importlib.util.find_spec("transformer_engine_torch") is not None:
        pytest.skip("TE's compiled extension is installed here")
    assert mode.te_extension_error() == "transformer_engine_torch is not installed"
