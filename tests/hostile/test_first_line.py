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
