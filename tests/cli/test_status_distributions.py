"""`status` reads a framework's version from the distribution that holds the watched module's file,
never from whatever is installed under the framework's name.

PyPI's `roll` 0.13.4, `slime` 0.0.0 and `chatlearn` 0.0.1 are other projects (scripts/setup-env.sh
installs the real ones in .deps/namesakes); the frameworks' mirrors (tests/mirrors) stand for their
source checkouts, and a mirror given a dist-info of its own (as ROLL's setup.py names it: `roll`
0.3.0) for an installed release.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import DEPS, MIRRORS, REPO, verl_path
from support.set_up import needs

CLI = Path(sys.executable).with_name("te-offload-shim")
NAMESAKES = DEPS / "namesakes"
OTHERS = {"roll": "roll 0.13.4", "slime": "slime 0.0.0", "pai-chatlearn": "chatlearn 0.0.1"}


def _status(*path: Path) -> dict:
    needs(NAMESAKES / "roll", f"PyPI's roll, slime and chatlearn not installed in {NAMESAKES}")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VERL_"))}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), *map(str, path)])
    proc = subprocess.run(
        [str(CLI), "status", "--json"], capture_output=True, text=True, env=full, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _rows(s: dict) -> dict[str, dict]:
    return {r["name"]: r for r in s["targets"]}


def test_namesakes_first_on_the_path_are_not_the_frameworks() -> None:
    """The unrelated packages shadow the mirrors: no entry point is present, and the versions
    section names them as other packages instead of giving their numbers as the frameworks'."""
    s = _status(NAMESAKES, MIRRORS)
    rows = _rows(s)
    for name in ("roll", "roll-train", "slime", "chatlearn", "chatlearn-inference"):
        assert rows[name]["present"] is False and rows[name]["version"] is None, name
    assert "roll 0.13.4 installed holds no roll.distributed.strategy.megatron_strategy" in rows["roll"]["version_basis"]
    assert {name: s["versions"][name] for name in OTHERS} == dict.fromkeys(OTHERS)
    assert s["namesakes"] == {name: [other] for name, other in OTHERS.items()}


def test_a_source_checkout_beside_namesakes_has_no_version() -> None:
    """The mirrors first: the entry points are present, in files no installed distribution holds,
    so the version is unknown and the row says that the same-named package is another one."""
    s = _status(MIRRORS, NAMESAKES)
    rows = _rows(s)
    for name, other in (("roll", "roll 0.13.4"), ("slime", "slime 0.0.0"), ("chatlearn", "chatlearn 0.0.1")):
        row = rows[name]
        assert row["present"] is True and row["version"] is None and row["held_by"] is None, name
        assert "no installed distribution holds" in row["version_basis"], name
        assert f"{other} installed is another package of that name" in row["in_supported_basis"], name
        assert row["in_supported"] is None and row["would_be_patched"] is True, name
    assert {name: s["versions"][name] for name in OTHERS} == dict.fromkeys(OTHERS)


def _install_mirror(site: Path, package: str, name: str, version: str) -> None:
    """The mirror's package copied into `site` with a dist-info whose RECORD lists its files, as
    pip would leave an installed release."""
    shutil.copytree(MIRRORS / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    files = sorted(str(p.relative_to(site)) for p in (site / package).rglob("*.py"))
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]))


def test_the_distribution_holding_the_module_gives_the_version(tmp_path: Path) -> None:
    """ROLL installed under the name its setup.py gives (`roll` 0.3.0) beside PyPI's `roll` 0.13.4:
    the row and the versions section read 0.3.0 from the one whose RECORD lists the module, and
    name the other as another package, though the two share a name."""
    _install_mirror(tmp_path, "roll", "roll", "0.3.0")
    s = _status(tmp_path, NAMESAKES)
    row = _rows(s)["roll"]
    assert row["present"] is True and row["version"] == "0.3.0" and row["held_by"] == "roll"
    assert row["in_supported"] is True and row["in_supported_basis"] == "roll 0.3.0 in >=0.1.0,<=0.3.0"
    assert s["versions"]["roll"] == "0.3.0"
    assert s["namesakes"]["roll"] == ["roll 0.13.4"]


def test_a_real_release_is_held_by_its_own_distribution() -> None:
    s = _status(verl_path("0.8.0"), NAMESAKES)
    row = _rows(s)["verl"]
    assert row["held_by"] == "verl" and row["version"] == "0.8.0"
    assert row["version_basis"].startswith("verl 0.8.0 holds ") and row["version_basis"].endswith("megatron_utils.py")
    assert row["fixed_upstream"] is False and row["in_supported"] is True
