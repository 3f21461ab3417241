"""The Transformer Engine releases the tests import from PyPI, and where each one lives.

`transformer-engine==X` on PyPI is a ~1.2 MB `py3-none-any` wheel holding TE's pure-Python code
(1.9.0 is an empty meta wheel: its code is in 1.9.0.post1). `scripts/setup-env.sh` installs each
release `--no-deps` into `.deps/te-X` (the folder named by the release, post suffix dropped).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"

# (release, pip requirement); the list in scripts/setup-env.sh must match (tests/test_te_real.py checks).
PIP = {
    "1.9.0": "1.9.0.post1",
    "1.13.0": "1.13.0",
    "2.1.0": "2.1.0",
    "2.4.0": "2.4.0",
    "2.8.0": "2.8.0",
    "2.9.0": "2.9.0",
    "2.10.0": "2.10.0",
    "2.12.0": "2.12.0",
    "2.16.1": "2.16.1",
    "2.18.0": "2.18.0",
    "2.19.0": "2.19.0",
    "2.20.2": "2.20.2",
}
RELEASES = tuple(PIP)


def folder(release: str) -> Path:
    return DEPS / f"te-{release}"


def installed(release: str) -> bool:
    return (folder(release) / "transformer_engine" / "pytorch" / "__init__.py").is_file()


def key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".")[:3])
