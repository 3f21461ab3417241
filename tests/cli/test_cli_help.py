"""The CLI speaks for itself: a version, help for every subcommand, errors that name what to type."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, child_env


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "te_offload_shim", *args]
    return subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=60)


def test_version_names_the_code() -> None:
    """The one version source, which pyproject.toml reads too (read as text: importing would
    install); the commit where the package runs from a git checkout; between releases (the
    CHANGELOG's newest section unreleased) a development version of that release."""
    source = (REPO / "te_offload_shim" / "_version.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', source, re.M)
    assert version is not None
    assert 'version = { attr = "te_offload_shim._version.__version__" }' in (REPO / "pyproject.toml").read_text()
    expected = f"te-offload-shim {version.group(1)}"
    if (REPO / ".git").exists():
        git = ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]
        expected += f" (commit {subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()})"
    for flag in ("--version", "-V"):
        proc = _cli(flag)
        assert proc.returncode == 0 and proc.stdout.strip() == expected
    newest = re.search(r"^## (\S+)( \(unreleased\))?$", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None
    if newest.group(2):
        assert re.fullmatch(rf"{re.escape(newest.group(1))}\.dev\d+", version.group(1)), "between releases: a .devN"


@pytest.mark.parametrize("command", ["enable", "disable", "run", "status", "stats", "startup-file", "selftest"])
def test_every_subcommand_has_help_text(command: str) -> None:
    proc = _cli(command, "--help")
    assert proc.returncode == 0
    description = proc.stdout.split("\n\n")[1].strip()
    assert len(description) > 20 and not description.startswith(("positional", "options")), proc.stdout


def test_a_missing_command_names_what_to_type() -> None:
    proc = _cli()
    assert proc.returncode == 2 and "COMMAND" in proc.stderr and "command_name" not in proc.stderr


@pytest.mark.parametrize(
    ("site", "expected"),
    [
        ("{tmp}/no-such-dir", "{tmp}/no-such-dir does not exist"),
        ("{tmp}/a-file", "{tmp}/a-file is not a directory"),
        ("/proc/self", "cannot write /proc/self/te_offload_shim.pth"),  # unwritable even for root
    ],
)
def test_enable_site_errors_are_one_line_and_create_nothing(tmp_path: Path, site: str, expected: str) -> None:
    (tmp_path / "a-file").write_text("")
    proc = _cli("enable", "--site", site.format(tmp=tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("te-offload-shim enable: " + expected.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing created"


def test_everything_disabled_is_said_and_not_a_failure() -> None:
    env = child_env({"TE_OFFLOAD_SHIM_DISABLE": "*"})
    proc = subprocess.run(
        [sys.executable, "-m", "te_offload_shim", "status"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert proc.returncode == 0
    assert "warning: every target is switched off by TE_OFFLOAD_SHIM_DISABLE=*: nothing is patched" in proc.stdout
