"""A `@where` spec calls only a final public method written in Python: a dunder or private step is
refused at install, a built-in method found at the call is left alone, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_util import cached_layer, write_module

_CALLS = """\
class Holder:
    def __init__(self, chunks):
        self.model = chunks
        self._chunks = chunks

    def get_models(self):
        return self.model

    def offload_list(self):
        return len(self.model)

    def offload_dunder(self):
        return len(self.__dict__)

    def offload_private(self):
        return len(self._chunks)

    def offload_method(self):
        return len(self.model)
"""
_SPECS = (
    "where_calls:Holder.offload_list@self.model.clear()",  # list.clear: a built-in method
    "where_calls:Holder.offload_dunder@self.__dict__.clear()",  # a dunder step
    "where_calls:Holder.offload_private@self._chunks.copy()",  # a private step before a call
    "where_calls:Holder.offload_method@self.get_models()",  # a public method written in Python
)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": ",".join(_SPECS)})
def test_a_where_spec_calls_only_a_public_method_written_in_python(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import te_offload_shim as shim

    problems = shim.status()["user_target_problems"]
    assert len(problems) == 2, problems
    assert "offload_dunder" in problems[0] and "__dict__" in problems[0], problems
    assert "offload_private" in problems[1] and "_chunks" in problems[1], problems
    warned = [r.getMessage() for r in caplog.records if "where_calls" in r.getMessage()]
    assert len(warned) == 2, warned

    write_module(tmp_path, "where_calls", _CALLS)
    import where_calls  # type: ignore[import-not-found]

    layer = cached_layer()
    holder = where_calls.Holder([layer])
    assert holder.offload_list() == 1, "list.clear was not called: the offload sees its models"
    assert layer._fp8_workspaces, "nothing was cleared for that call"
    assert holder.offload_dunder() == 2 and holder.offload_private() == 1
    left = shim.stats()["left_alone"]["where_calls:Holder.offload_list"]
    assert list(left.values()) == [1] and "built-in" in next(iter(left)), left
    assert holder.offload_method() == 1 and layer._fp8_workspaces == {}
