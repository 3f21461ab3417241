"""What is installed, read from package metadata and the file system, never by importing it.

`te-offload-shim status` must be cheap and must not change the process it describes: importing
verl or megatron would pull torch, and would patch them. Imported by the CLI only.

"Present" for a target means its module file exists. We look for it from the top-level package's
search locations, walking folders: `importlib.util.find_spec("a.b.c")` would import `a` and `a.b`.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata, util
from typing import Any

from te_offload_shim import _switches
from te_offload_shim.integrations.specifiers import SpecifierSet, Version, parse_version
from te_offload_shim.integrations.targets import Target

# Distributions reported by `status`; TE ships under several names depending on the build.
CORE = ("wrapt", "torch", "transformer-engine", "megatron-core")
TE_NAMES = ("transformer-engine", "transformer-engine-torch", "transformer-engine-cu12", "transformer-engine-cu13")
WRAPT_NEEDED = ">=1.14"  # as pyproject.toml's dependency


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


def declaration_problems(target: Target) -> list[str]:
    """What is malformed in a target's release declaration (targets.py); [] when it is sound."""
    problems = []
    for field, text in (("supported", target.supported), ("fixed_in", target.fixed_in)):
        if text is None:
            continue
        try:
            SpecifierSet(text if field == "supported" else f">={text}")
        except ValueError as exc:
            problems.append(f"{target.name}: {field}: {exc}")
    if (target.supported is not None or target.fixed_in is not None) and not target.distribution:
        problems.append(f"{target.name}: releases are declared without the distribution they are of")
    if (target.fixed_in is None) != (target.fixed_marker is None):
        problems.append(
            f"{target.name}: fixed_in and fixed_marker go together (the version for status, the marker at run time)"
        )
    if target.supported is None and target.distribution and not target.note:
        problems.append(f"{target.name}: no supported releases and no note saying which revisions have it")
    return problems


def _release(target: Target, dist_version: str | None) -> tuple[Version | None, str]:
    if dist_version is None:
        return None, f"{target.distribution} version unknown"
    try:
        return parse_version(dist_version), ""
    except ValueError as exc:
        return None, str(exc)


def fixed_upstream(target: Target, dist_version: str | None) -> tuple[bool | None, str]:
    """(fixed?, how we know) from the declared `fixed_in`, without importing the target."""
    if target.fixed_in is None:
        return False, "no release is declared to clear the caches itself"
    found, why = _release(target, dist_version)
    if found is None:
        return None, why
    try:
        fixed = found in SpecifierSet(f">={target.fixed_in}")
    except ValueError as exc:
        return None, str(exc)
    return fixed, f"{target.distribution} {dist_version} {'>=' if fixed else '<'} {target.fixed_in} (by version)"


def in_supported(target: Target, dist_version: str | None) -> tuple[bool | None, str]:
    """(is the installed release one the entry declares?, how we know)."""
    if target.supported is None:
        return None, target.note or "no supported releases declared"
    found, why = _release(target, dist_version)
    if found is None:
        return None, why
    try:
        inside = found in SpecifierSet(target.supported)
    except ValueError as exc:
        return None, str(exc)
    return inside, f"{target.distribution} {dist_version} {'in' if inside else 'not in'} {target.supported}"


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
    try:
        return found is not None and found in SpecifierSet(WRAPT_NEEDED)
    except ValueError:  # an unreadable version: say so rather than guess
        return False


def target_row(target: Target, enabled: bool) -> dict[str, Any]:
    """What we can tell about one target without importing it."""
    dist_version = version(target.distribution) if target.distribution else None
    present = module_present(target.module)
    fixed, basis = fixed_upstream(target, dist_version) if present else (None, "not present")
    supported, supported_basis = in_supported(target, dist_version) if present else (None, "not present")
    is_disabled = _switches.is_disabled(target.name)
    return {
        "name": target.name,
        "target": target.path,
        "user": target.user,
        "distribution": target.distribution,
        "present": present,
        "version": dist_version,
        "supported": target.supported,
        "in_supported": supported,
        "in_supported_basis": supported_basis,
        "fixed_in": target.fixed_in,
        "note": target.note,
        "fixed_upstream": fixed,
        "fixed_upstream_basis": basis,
        "disabled": is_disabled,
        "would_be_patched": bool(enabled and present and fixed is not True and not is_disabled),
    }
