"""What is installed, read from package metadata and the file system, never by importing it.

`te-offload-shim status` must be cheap and must not change the process it describes: importing
verl or megatron would pull torch, and would patch them. Imported by the CLI only.

"Present" for a target means its module file exists. We look for it from the top-level package's
search locations, walking folders: `importlib.util.find_spec("a.b.c")` would import `a` and `a.b`.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata, util
from typing import Any

from te_offload_shim import _switches
from te_offload_shim.integrations.targets import Target

# Distributions reported by `status`; TE ships under several names depending on the build.
CORE = ("wrapt", "torch", "transformer-engine", "megatron-core")
TE_NAMES = ("transformer-engine", "transformer-engine-torch", "transformer-engine-cu12", "transformer-engine-cu13")
WRAPT_MIN = (1, 14)

# Upstream fixes that a version number tells (verl PR #6952, first released in
# verl 0.9.0). Other targets have no upstream fix, or one that depends on a run-time flag.
FIXED_FROM = {"verl": (0, 9, 0)}


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not break status
        return None


def te_version() -> str | None:
    for name in TE_NAMES:
        found = version(name)
        if found is not None:
            return found
    return None


def parse(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: '0.9.0rc1' -> (0, 9, 0)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def module_present(name: str) -> bool:
    """Whether the module's file exists, without importing it or its parents."""
    top, *rest = name.split(".")
    try:
        spec = util.find_spec(top)  # a top-level name imports nothing
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    locations = list(spec.submodule_search_locations or ())
    for part in rest[:-1]:
        locations = [os.path.join(d, part) for d in locations if os.path.isdir(os.path.join(d, part))]
    last = rest[-1]
    suffixes = (".py", ".pyc", *_extension_suffixes())
    for directory in locations:
        if os.path.isfile(os.path.join(directory, last, "__init__.py")):
            return True
        if any(os.path.isfile(os.path.join(directory, last + s)) for s in suffixes):
            return True
    return False


def _extension_suffixes() -> list[str]:
    from importlib.machinery import EXTENSION_SUFFIXES

    return list(EXTENSION_SUFFIXES)


def fixed_upstream(target: Target, dist_version: str | None) -> tuple[bool | None, str]:
    """(fixed?, how we know) without importing the target."""
    first = FIXED_FROM.get(target.name)
    if first is None:
        return False, "no upstream fix is known" if target.fixed_upstream is None else "checked on import"
    if dist_version is None:
        return None, f"{target.distribution} version unknown"
    fixed = parse(dist_version) >= first
    wanted = ".".join(map(str, first))
    return fixed, f"{target.distribution} {dist_version} {'>=' if fixed else '<'} {wanted} (by version)"


def versions() -> dict[str, str | None]:
    """Python and the packages an operator asks about, frameworks included."""
    from te_offload_shim.integrations.targets import BUILTIN

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in CORE:
        found[name] = te_version() if name == "transformer-engine" else version(name)
    for target in BUILTIN:
        if target.distribution and target.distribution not in found:
            found[target.distribution] = version(target.distribution)
    return found


def wrapt_ok(found: str | None) -> bool:
    return found is not None and parse(found) >= WRAPT_MIN


def target_row(target: Target, enabled: bool) -> dict[str, Any]:
    """What we can tell about one target without importing it."""
    dist_version = version(target.distribution) if target.distribution else None
    present = module_present(target.module)
    fixed, basis = fixed_upstream(target, dist_version) if present else (None, "not present")
    is_disabled = _switches.is_disabled(target.name)
    return {
        "name": target.name,
        "target": target.path,
        "user": target.user,
        "distribution": target.distribution,
        "present": present,
        "version": dist_version,
        "supported_versions": target.versions,
        "fixed_upstream": fixed,
        "fixed_upstream_basis": basis,
        "disabled": is_disabled,
        "would_be_patched": bool(enabled and present and fixed is not True and not is_disabled),
    }
