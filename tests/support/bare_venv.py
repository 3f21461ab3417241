"""What pip installs beside te_offload_shim in a bare venv that a test builds by hand (`--no-deps`,
wrapt through a path .pth): `packaging`, a declared dependency that `status` imports."""

from __future__ import annotations

import shutil
from pathlib import Path


def install_packaging(site: Path) -> None:
    """A copy of this interpreter's `packaging` in `site`, as `pip install te-offload-shim` leaves it."""
    import packaging

    shutil.copytree(Path(packaging.__file__).parent, site / "packaging", ignore=shutil.ignore_patterns("__pycache__"))
