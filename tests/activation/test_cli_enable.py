"""`te-offload-shim enable` / `disable` in a real venv built by the test.

The package goes in from a wheel built from this checkout, so `pip uninstall` later removes it
for real while our .pth stays behind. No torch in that venv: a one-function module is the target
(`TE_OFFLOAD_SHIM_TARGETS`), and wrapt 1.x comes from .deps/wrapt-1 through a path .pth.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEPS, REPO
from support.bare_venv import install_packaging

PROBE = REPO / "tests" / "run_files" / "enable_probe.py"  # run by each venv's interpreter


def _sh(*cmd: object, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "PYTHON", "VIRTUAL_ENV"))}
    full.update(env or {})
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=full, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, so that the build leaves nothing in the shared checkout.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "te_offload_shim", src / "te_offload_shim", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    _sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, src)
    (found,) = out.glob("te_offload_shim-*.whl")
    return found


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        self.cli = root / "bin" / "te-offload-shim"
        self.site = Path(
            _sh(self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
        )
        self.pth = self.site / "te_offload_shim.pth"

    def pip(self, *args: str) -> None:
        _sh(sys.executable, "-m", "pip", "--python", self.python, *args, "-q", "--disable-pip-version-check")

    def probe(self, *flags: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
        proc = _sh(self.python, *flags, PROBE, env=env)
        return json.loads(proc.stdout), proc.stderr

    def status(self, *flags: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
        proc = _sh(self.cli, "status", "--json", *flags, env=env, check=False)
        return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture
def venv(tmp_path: Path, wheel: Path) -> Venv:
    _sh(sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv")
    env = Venv(tmp_path / "venv")
    env.pip("install", "--no-deps", "--no-index", str(wheel))
    (env.site / "wrapt_1.pth").write_text(f"{DEPS / 'wrapt-1'}\n")
    install_packaging(env.site)
    (env.site / "faketarget.py").write_text("def offload(models):\n    return models\n")
    return env


FAKE = {"TE_OFFLOAD_SHIM_TARGETS": "faketarget:offload"}


def test_enable_activates_every_start_once_and_costs_nothing_until_a_target(venv: Venv) -> None:
    before, _ = venv.probe()
    assert before["loaded"] is False, "nothing activates the shim before `enable`"

    first = _sh(venv.cli, "enable")
    assert first.stdout.splitlines()[0] == f"te-offload-shim: enabled: {venv.pth}"
    text = venv.pth.read_text()
    assert _sh(venv.cli, "enable").stdout.strip() == f"te-offload-shim: already enabled: {venv.pth}"
    assert venv.pth.read_text() == text
    import_lines = [line for line in text.splitlines() if line.startswith("import")]
    assert len(import_lines) == 1, "site.py runs only lines starting with 'import'"

    # Count how often site.py runs this venv's .pth files (twice in a venv on some versions).
    counter = venv.root / "pth-runs"
    (venv.site / "zz_count.pth").write_text(
        f"import os; open({str(counter)!r}, 'a').write('x') if os.environ.get('COUNT_PTH') else None\n"
    )
    for flags in ((), ("-I",)):
        r, err = venv.probe(*flags, env={**FAKE, "COUNT_PTH": "1"})
        assert r["loaded"] and r["installed"], flags
        assert r["isolated"] == (1 if flags else 0)
        assert r["wrapt_at_start"] is False, "no wrapt until a target module is imported"
        assert r["wrapt_after_target"] is True
        assert r["layers"] == 1 and r["state"] == "patched", f"wrapped once even if the .pth runs twice {flags}"
        assert err == ""
    assert len(counter.read_text()) >= 2  # both runs above went through the .pth files

    code, s, err = venv.status(env=FAKE)
    assert code == 0 and err == "" and s["healthy"] is True and s["problems"] == []
    assert s["routes"]["pth"] == [{"path": str(venv.pth), "current": True, "readable": True, "mode": "0644"}]
    assert s["routes"]["sitecustomize_bootstrap"] is False and s["routes"]["verl_external_modules"] is False
    assert s["shim"]["enabled"] is True and s["shim"]["path"] == str(venv.site / "te_offload_shim")
    assert s["python"]["executable"] == str(venv.python)
    assert s["versions"]["wrapt"] == "1.17.3" and s["versions"]["torch"] is None and s["versions"]["verl"] is None
    assert s["switches"] == FAKE
    rows = {r["name"]: r for r in s["targets"]}
    fake = rows["faketarget:offload"]
    assert fake["present"] is True and fake["would_be_patched"] is True and fake["state"] == "pending"
    assert rows["verl"]["present"] is False and rows["verl"]["would_be_patched"] is False

    code, s, _ = venv.status("--import", env=FAKE)
    fake = {r["name"]: r for r in s["targets"]}["faketarget:offload"]
    assert code == 0 and fake["state"] == "patched" and fake["layers"] == 1 and fake["imported"] is True


def test_switched_off_by_env_without_importing_the_package(venv: Venv) -> None:
    _sh(venv.cli, "enable")
    for flags in ((), ("-I",)):
        r, err = venv.probe(*flags, env={**FAKE, "TE_OFFLOAD_SHIM": "0"})
        assert r["loaded"] is False and "layers" not in r and err == ""
    code, s, err = venv.status(env={"TE_OFFLOAD_SHIM": "0"})
    # Switched off is an operator's choice, not a fault: exit 0 (an image check still passes), said.
    assert code == 0 and s["healthy"] is True and s["shim"]["enabled"] is False and err == ""
    assert "switched off by TE_OFFLOAD_SHIM=0: nothing is patched" in s["warnings"]
    assert s["switches"] == {"TE_OFFLOAD_SHIM": "0"}
    assert all(r["would_be_patched"] is False for r in s["targets"])


def test_disable_removes_the_line(venv: Venv) -> None:
    _sh(venv.cli, "enable")
    assert _sh(venv.cli, "disable").stdout.strip() == f"te-offload-shim: disabled: {venv.pth}"
    assert not venv.pth.exists()
    assert _sh(venv.cli, "disable").stdout.strip() == f"te-offload-shim: already disabled: {venv.pth}"
    r, _ = venv.probe(env=FAKE)
    assert r["loaded"] is False and "layers" not in r
    code, s, _ = venv.status()
    assert code == 0 and s["routes"]["pth"] == []
    assert s["routes"]["in_force"].startswith("none: active only where code imports te_offload_shim")


def test_stale_pth_after_uninstall_is_silent(venv: Venv) -> None:
    _sh(venv.cli, "enable")
    venv.pip("uninstall", "-y", "te-offload-shim")
    assert venv.pth.exists(), "pip does not know about our .pth: it stays behind"
    for flags in ((), ("-I",)):
        r, err = venv.probe(*flags)
        assert r["loaded"] is False and err == "", "the stale line imports nothing and says nothing"


def test_enable_site_dir_and_python_m(venv: Venv, tmp_path: Path) -> None:
    target = tmp_path / "image-site"
    target.mkdir()  # --site never creates a folder (tests/cli/test_cli_help.py checks that)
    proc = _sh(venv.python, "-m", "te_offload_shim", "enable", "--site", target)
    assert proc.stdout.strip() == f"te-offload-shim: enabled: {target / 'te_offload_shim.pth'}"
    assert not venv.pth.exists(), "--site writes there only"
    _sh(venv.cli, "enable")
    assert venv.pth.read_text() == (target / "te_offload_shim.pth").read_text()
    (target / "te_offload_shim.pth").write_text("import os\n")
    assert "updated" in _sh(venv.python, "-m", "te_offload_shim", "enable", "--site", target).stdout
    assert _sh(venv.python, "-m", "te_offload_shim", "disable", "--site", target).stdout.startswith(
        "te-offload-shim: disabled:"
    )
    assert not (target / "te_offload_shim.pth").exists()
