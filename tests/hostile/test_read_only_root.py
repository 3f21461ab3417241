"""A container whose root file system is read-only (Kubernetes `readOnlyRootFilesystem`, no
writable /tmp): every command works or fails in one line. Found in this suite's own hostile round:
`status --import` held the imports' file descriptor 1 in a temporary file, and there is no usable
temporary folder there; it now uses an anonymous memory file.

The file system is made read-only in a mount namespace of its own (`unshare --mount`, as root);
skipped where the machine does not allow that."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, child_env

TARGETS = Path(__file__).resolve().parent / "targets"


def _read_only(*command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = 'mount -o remount,bind,ro / || exit 99; touch /tmp/.te-offload-shim-rw 2>/dev/null && exit 98; exec "$@"'
    proc = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *command],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    if proc.returncode in (98, 99) or (proc.returncode == 1 and proc.stderr.startswith("unshare")):
        pytest.skip(f"no read-only root file system in a mount namespace here: {proc.stderr.strip()[:200]}")
    return proc


def test_every_command_on_a_read_only_root_file_system(checkout_python: Path) -> None:
    env = child_env({"TE_OFFLOAD_SHIM_TARGETS": "noisy_import:offload"}, path=[TARGETS])
    cli = [str(checkout_python), "-m", "te_offload_shim"]
    proc = _read_only(*cli, "status", "--import", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert "noisy_import: written to file descriptor 1" in report["import_output"]
    assert {r["name"]: r for r in report["targets"]}["noisy_import:offload"]["state"] == "patched"
    proc = _read_only(*cli, "status", env=env)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "healthy", proc.stderr
    probe = REPO / "tests" / "run_files" / "enable_probe.py"
    proc = _read_only(*cli, "run", "--", str(checkout_python), str(probe), env=child_env())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout)["installed"] is True, "run's bootstrap activates the shim there too"
    proc = _read_only(*cli, "enable", env=env)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "Read-only file system" in proc.stderr, proc.stderr
    # nothing to remove is no failure on any mount (issue 36): `disable` says so and exits 0
    proc = _read_only(*cli, "disable", env=env)
    assert proc.returncode == 0 and proc.stderr == "" and "already disabled" in proc.stdout, proc.stderr
