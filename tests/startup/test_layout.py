"""The start-up path stays small, and the layout the README describes is the package's.

`import te_offload_shim` may load one module of ours and nothing else (`_switches` too when a
switch is set); the module names it watches must be the table's.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "te_offload_shim"
README = PACKAGE.parent / "README.md"


def test_the_start_up_path_watches_exactly_the_modules_of_the_table() -> None:
    import te_offload_shim
    from te_offload_shim.integrations.targets import BUILTIN

    assert list(te_offload_shim.BUILTIN_MODULES) == list(dict.fromkeys(t.module for t in BUILTIN))


@pytest.mark.subprocess(fresh=True)
def test_import_loads_one_module_of_ours_and_nothing_else() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == {"te_offload_shim"}


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_STRICT": "1"}, fresh=True)
def test_a_switch_set_adds_only_the_switches_module() -> None:
    before = set(sys.modules)
    import te_offload_shim

    assert te_offload_shim.installed()
    assert set(sys.modules) - before == {"te_offload_shim", "te_offload_shim._switches"}


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM": "0"})
def test_switched_off_at_start_up_installs_nothing() -> None:
    import te_offload_shim

    assert not te_offload_shim.installed()
    assert te_offload_shim.install() is False


def test_report_types_are_exported_lazily_and_typed() -> None:
    import te_offload_shim
    from te_offload_shim.engine import status
    from te_offload_shim.te import caches

    assert te_offload_shim.CacheReport is caches.CacheReport
    assert te_offload_shim.ShimError is caches.ShimError
    assert te_offload_shim.Status is status.Status
    assert set(te_offload_shim.__all__) >= {"CacheReport", "Skipped", "ShimError", "ResidueReport", "Status", "Stats"}
    assert {"status", "uninstall", "scan", "CacheReport"} <= set(dir(te_offload_shim)), "dir() lists the lazy names"
    assert te_offload_shim.uninstall.__module__ == "te_offload_shim.api"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        te_offload_shim.nope  # noqa: B018
    row_keys = set(status.TargetRow.__annotations__)
    assert row_keys == set(te_offload_shim.status()["targets"][0])
    assert set(status.Stats.__annotations__) == set(te_offload_shim.stats())


def test_every_module_of_the_package_is_in_the_readme_layout() -> None:
    """A newcomer finds each module in README's "Layout" section, and nothing listed there is gone."""
    text = README.read_text()
    section = text[text.index("## Layout") :]
    section = section[: section.index("\n## ", 1)]
    listed = set(re.findall(r"`(te_offload_shim/[\w/]+\.py)`", section))
    present = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}
    present = {p for p in present if not p.endswith("/__init__.py") or p == "te_offload_shim/__init__.py"}
    assert present - listed == set(), "modules missing from README's Layout section"
    assert listed - present == set(), "README's Layout section names modules that do not exist"
