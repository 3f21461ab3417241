"""Bare venvs that tests build by hand: what pip installs beside te_offload_shim there (`--no-deps`,
wrapt through a path .pth): `packaging`, a declared dependency that `status` imports; and a venv that
sees only this checkout (tests/conftest.py's `checkout_python` fixture)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def install_packaging(site: Path) -> None:
    """A copy of this interpreter's `packaging` in `site`, as `pip install te-offload-shim` leaves it."""
    import packaging

    shutil.copytree(Path(packaging.__file__).parent, site / "packaging", ignore=shutil.ignore_patterns("__pycache__"))


def checkout_venv(root: Path) -> Path:
    """A venv at `root` that sees only this checkout, wrapt 1.x and `packaging`, without torch and the
    frameworks (whose imports `status --import` would otherwise run, seconds each time). Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = root.glob("lib/python3.*/site-packages")
    (site / "checkout.pth").write_text(f"{REPO}\n{REPO / '.deps' / 'wrapt-1'}\n")
    install_packaging(site)
    return root / "bin" / "python"
