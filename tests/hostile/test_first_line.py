"""The line that proves the shim worked is seen at Python's default logging (WARNING and up),
once per job: at WARNING on rank 0, at INFO (unseen by default) on the other ranks, and at INFO
everywhere when the application logs INFO itself."""

from __future__ import annotations

import logging

import pytest
from hostile_util import cached_layer, use_targets

TARGET = {"TE_OFFLOAD_SHIM_TARGETS": "shim_targets:offload"}


def _first_lines(caplog: pytest.LogCaptureFixture) -> list[int]:
    import te_offload_shim

    use_targets()
    import shim_targets

    caplog.set_level(logging.NOTSET, logger="te_offload_shim")  # the application's levels decide
    for _ in range(3):
        shim_targets.offload([cached_layer()])
    assert te_offload_shim.stats()["entries"] == 3
    return [r.levelno for r in caplog.records if "cleared 1 FP8 weight workspaces" in r.getMessage()]


@pytest.mark.subprocess(env={**TARGET, "RANK": "0"})
def test_rank_zero_says_it_once_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    logging.getLogger().setLevel(logging.WARNING)  # Python's default
    assert _first_lines(caplog) == [logging.WARNING], "one line, seen; the later ones are DEBUG"


@pytest.mark.subprocess(env={**TARGET, "RANK": "3"})
def test_other_ranks_keep_it_at_info(caplog: pytest.LogCaptureFixture) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    assert _first_lines(caplog) == [], "INFO, below Python's default level"


@pytest.mark.subprocess(env={**TARGET, "RANK": "0"})
def test_an_application_logging_info_gets_it_at_info(caplog: pytest.LogCaptureFixture) -> None:
    logging.getLogger().setLevel(logging.INFO)
    assert _first_lines(caplog) == [logging.INFO]


# --- ranks: every launcher's variable, then torch.distributed ------------------------------------


def _lines(caplog: pytest.LogCaptureFixture) -> tuple[list[int], str]:
    """(the levels of the lines seen at Python's default logging, a later line as DEBUG shows it)."""
    logging.getLogger().setLevel(logging.WARNING)
    seen = _first_lines(caplog)
    import shim_targets

    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="te_offload_shim")
    shim_targets.offload([cached_layer()])
    (line,) = [r.getMessage() for r in caplog.records if "cleared 1 FP8" in r.getMessage()]
    return seen, line


@pytest.mark.subprocess(env={**TARGET, "SLURM_PROCID": "3"})
def test_slurm_procid_is_the_rank(caplog: pytest.LogCaptureFixture) -> None:
    seen, line = _lines(caplog)
    assert seen == [] and line.startswith("[rank 3] shim_targets:offload: cleared")


@pytest.mark.subprocess(env={**TARGET, "OMPI_COMM_WORLD_RANK": "5"})
def test_open_mpi_rank_is_the_rank(caplog: pytest.LogCaptureFixture) -> None:
    seen, line = _lines(caplog)
    assert seen == [] and line.startswith("[rank 5] ")


@pytest.mark.subprocess(env={**TARGET, "PMI_RANK": "0"})
def test_pmi_rank_zero_says_it_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    seen, line = _lines(caplog)
    assert seen == [logging.WARNING] and line.startswith("[rank 0] ")


@pytest.mark.subprocess(env={**TARGET, "RANK": "abc", "SLURM_PROCID": "00"})
def test_a_value_that_is_no_rank_is_passed_over(caplog: pytest.LogCaptureFixture) -> None:
    """`RANK=abc` is no rank: the next variable is asked (`00` is rank 0, which says it at WARNING);
    it was the tag, every process logged at INFO, and a `/` in one went into the stats file's path."""
    seen, line = _lines(caplog)
    assert seen == [logging.WARNING] and line.startswith("[rank 0] "), (seen, line)


@pytest.mark.subprocess(env={**TARGET, "RANK": "2", "SLURM_PROCID": "0", "PMI_RANK": "0"})
def test_rank_comes_before_the_launchers_own(caplog: pytest.LogCaptureFixture) -> None:
    seen, line = _lines(caplog)
    assert seen == [] and line.startswith("[rank 2] ")


@pytest.mark.subprocess(env=TARGET)
def test_torch_distributed_gives_the_rank_when_no_variable_does(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    import torch.distributed as dist

    from te_offload_shim import _switches

    assert _switches.rank() is None, "no launcher's variable, torch.distributed not initialised"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        seen, line = _lines(caplog)
    finally:
        dist.destroy_process_group()
    assert seen == [logging.WARNING] and line.startswith("[rank 0] ")


# --- the name said once; TE_OFFLOAD_SHIM_LOG ------------------------------------------------------


def _offload_twice() -> None:
    import te_offload_shim

    use_targets()
    import shim_targets

    for _ in range(2):
        shim_targets.offload([cached_layer()])
    assert te_offload_shim.stats()["entries"] == 2


def _without_pytests_handlers() -> None:
    """The application configured no logging: pytest's own capture handlers taken off the root."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)


@pytest.mark.subprocess(env={**TARGET, "RANK": "1"})
@pytest.mark.parametrize(
    ("style", "fmt"), [("%", "%(name)s: %(message)s"), ("{", "{name}: {message}"), ("$", "$name: $message")]
)
def test_a_name_format_shows_the_name_once(capfd: pytest.CaptureFixture[str], style: str, fmt: str) -> None:
    """In every format style: the formatter is asked, not its format string read (a `$name` format
    printed the name twice)."""
    logging.basicConfig(format=fmt, style=style, level=logging.INFO, force=True)  # type: ignore[call-overload]
    _offload_twice()
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith("te_offload_shim: [rank 1] shim_targets:offload: cleared 1 FP8 weight workspaces")


@pytest.mark.subprocess(env={**TARGET, "RANK": "1", "TE_OFFLOAD_SHIM_LOG": "debug"})
def test_the_log_switch_gives_its_own_stderr_handler_when_none_is_configured(capfd: pytest.CaptureFixture[str]) -> None:
    _without_pytests_handlers()
    _offload_twice()
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 2 and all(
        line.startswith("te_offload_shim: [rank 1] shim_targets:offload: ") for line in lines
    )


@pytest.mark.subprocess(env={**TARGET, "RANK": "1", "TE_OFFLOAD_SHIM_LOG": "info"})
def test_the_log_switch_adds_no_second_line_to_the_applications_handler(capfd: pytest.CaptureFixture[str]) -> None:
    _without_pytests_handlers()
    logging.basicConfig(format="app %(levelname)s %(message)s")  # the application's, at WARNING
    _offload_twice()
    (line,) = capfd.readouterr().err.splitlines()  # the first at INFO (the switch's level), the second DEBUG
    assert line.startswith("app INFO te_offload_shim: [rank 1] shim_targets:offload: cleared 1 FP8")
