"""What is installed, read from package metadata and the file system, never by importing it.

`te-offload-shim status` must be cheap and must not change the process it describes: importing
verl or megatron would pull torch, and would patch them. Imported by the CLI only.

"Present" for a target means its module file exists. We look for it from the top-level package's
search locations, walking folders: `importlib.util.find_spec("a.b.c")` would import `a` and `a.b`.

A target's version is that of the distribution that holds the module file found (its RECORD lists
the file, or it is an editable install of the folder the file is in), never that of whatever
distribution happens to share the framework's name: PyPI's `roll`, `slime` and `chatlearn` are
other projects, and a source checkout on PYTHONPATH belongs to no distribution. When nothing
installed holds the file, the version is unknown and the row says why (`version_basis`).

The specifiers (`supported=">=0.4.0"`) are matched with `packaging`, the ecosystem's PEP 440
implementation (a declared dependency, and one megatron-core and TE's PyTorch code already import),
imported here lazily: only `status` and the tests ever load it.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import platform
import sys
from collections.abc import Callable
from importlib import metadata, util
from importlib.machinery import PathFinder
from typing import Any
from urllib.parse import unquote, urlparse

from te_offload_shim import _switches
from te_offload_shim.integrations.targets import Target

# Distributions reported by `status`; TE ships under several names depending on the build.
CORE = ("wrapt", "torch", "transformer-engine", "megatron-core")
TE_NAMES = ("transformer-engine", "transformer-engine-torch", "transformer-engine-cu12", "transformer-engine-cu13")
WRAPT_NEEDED = ">=1.14"  # as pyproject.toml's dependency


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except Exception:  # not installed (PackageNotFoundError), or a broken dist-info: status goes on
        return None


def module_file(name: str) -> str | None:
    """The file the import system would load for `name` (a package's `__init__.py`), found without
    importing it or its parents; None when there is none."""
    top, *rest = name.split(".")
    try:
        spec = util.find_spec(top)  # a top-level name imports nothing
        for part in rest:  # then the path finder's own lookup in the package's folders, which imports nothing
            spec = PathFinder.find_spec(part, list(spec.submodule_search_locations or ())) if spec else None
    except (ImportError, ValueError):
        return None
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        return spec.origin
    if spec is not None and not rest:  # a namespace package has no file: its first folder stands for it
        return next(iter(spec.submodule_search_locations or ()), None)
    return None


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")  # PEP 503


def _holds(dist: metadata.PathDistribution, root: str, path: str) -> bool:
    """Whether `path` is one of the files the distribution (installed in `root`) lists in its RECORD
    (an .egg-info: its list of files), or lies in the folder an editable install of it points at."""
    real = os.path.realpath(path)
    try:
        if real.startswith(root + os.sep):
            # RECORD read as text, not parsed (torch's lists some 20,000 files); an .egg-info: its
            # list of files, in RECORD's shape
            record = dist.read_text("RECORD") or "".join(f"{file},\n" for file in dist.files or ())
            if "\n" + os.path.relpath(real, root).replace(os.sep, "/") + "," in "\n" + record:
                return True
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        editable = direct.get("dir_info", {}).get("editable") and direct.get("url", "").startswith("file:")
        return bool(editable) and real.startswith(os.path.realpath(unquote(urlparse(direct["url"]).path)) + os.sep)
    except Exception:  # an unreadable RECORD or direct_url.json: this one does not say it holds the file
        return False


def _installs_under(dist: metadata.PathDistribution, top: str) -> bool:
    """Whether its top_level.txt names `top`, or its RECORD lists a file under `top/` (a newline in
    front of the RECORD's text, so that every line starts after one)."""
    top_level = dist.read_text("top_level.txt") or ""
    return top in top_level.split() or f"\n{top}/" in "\n" + (dist.read_text("RECORD") or "")


def holder(module: str, distribution: str | None) -> dict[str, Any]:
    """Which installed distribution holds `module`'s file (looked up by the file, not by name):
    `{"file", "holder", "version", "namesakes"}`; `namesakes` are the installed distributions
    named `distribution`, or named like the module's top-level package and installing files under
    it, that do not hold it, as "name version"."""
    path = module_file(module)
    top = module.split(".")[0]
    installed = _installed(tuple(sys.path))
    named = [i for i in installed if distribution and i[0] == _normal(distribution)]
    # PyPI's `chatlearn` is not `pai-chatlearn`, but installs a top-level `chatlearn`
    like_top = [i for i in installed if i[0] == _normal(top) and i not in named and _installs_under(i[2], top)]
    held = None
    if path is not None:
        real = os.path.realpath(path)
        same_root = [i for i in installed if real.startswith(i[1] + os.sep) and i not in named and i not in like_top]
        same_root.sort(key=lambda i: not _installs_under(i[2], top))  # the likely holders first
        held = next((i for i in named + like_top + same_root if _holds(i[2], i[1], path)), None)
    name, release = (held[2].metadata["Name"], held[2].version) if held is not None else (None, None)
    # by identity, not name: ROLL's own setup.py and PyPI's unrelated package are both `roll`
    namesakes = [f"{i[2].metadata['Name']} {i[2].version}" for i in named + like_top if i is not held]
    return {"file": path, "holder": name, "version": release, "namesakes": namesakes}


@functools.cache
def _installed(path: tuple[str, ...]) -> list[tuple[str, str, metadata.PathDistribution]]:
    """(normalised name, the folder it is installed in, the distribution) for every dist-info or
    egg-info on the search path, in path order: the name from the folder's (`megatron_core-0.16.1
    .dist-info`), as importlib.metadata finds them, without reading each one's METADATA."""
    found = []
    for entry in path:
        try:
            root = os.path.realpath(entry or ".")
            names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                project = name.rsplit(".", 1)[0].split("-", 1)[0]
                found.append((_normal(project), root, metadata.PathDistribution(pathlib.Path(root, name))))
    return found


def _own(held: dict[str, Any], distribution: str | None) -> bool:
    """Whether the distribution holding the module is the entry's own (a fork's version is not the framework's)."""
    return held["holder"] is not None and _normal(held["holder"]) == _normal(distribution or "")


def _match(
    target: Target, dist_version: str | None, unknown: str | None, match: Callable[[Any], bool], said: str
) -> tuple[bool | None, str]:
    """`match` of the installed release (a packaging Version) and how we know (`said`: what is
    written for yes and for no, `|` between them), or (None, why it cannot be told: `unknown`, the
    module file's holder, where that says why)."""
    if dist_version is None:
        return None, unknown or f"{target.distribution} version unknown"
    from packaging.version import Version

    try:
        found = match(Version(dist_version))
    except ValueError as exc:  # InvalidVersion and InvalidSpecifier are ValueErrors
        return None, str(exc)
    return found, f"{target.distribution} {dist_version} {said.split('|')[0 if found else 1]}"


def fixed_upstream(target: Target, dist_version: str | None, unknown: str | None = None) -> tuple[bool | None, str]:
    """(fixed?, how we know) from the declared `fixed_in`, without importing the target."""
    if target.fixed_in is None:
        return False, "no release is declared to clear the caches itself"
    from packaging.version import Version

    fixed_in = target.fixed_in
    said = f">= {fixed_in} (by version)|< {fixed_in} (by version)"
    return _match(target, dist_version, unknown, lambda found: found >= Version(fixed_in), said)


def in_supported(target: Target, dist_version: str | None, unknown: str | None = None) -> tuple[bool | None, str]:
    """(is the installed release one the entry declares?, how we know). An installed pre-release or
    local build counts as the release it is (pip's `prereleases=True` for what is already there)."""
    if target.supported is None:
        return None, target.note or "no supported releases declared"
    from packaging.specifiers import SpecifierSet

    supported = target.supported
    inside = f"in {supported}|not in {supported}"
    return _match(target, dist_version, unknown, lambda found: SpecifierSet(supported).contains(found, True), inside)


def versions() -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """(versions, namesakes). Versions: Python and the packages an operator asks about, frameworks
    included; a framework's version is that of the distribution holding its modules (None when an
    installed one of its name holds none of them). Namesakes: the installed distributions named for
    a framework that hold none of its watched modules, by that name (`{"roll": ["roll 0.13.4"]}`
    for PyPI's unrelated `roll`)."""
    from te_offload_shim.integrations.targets import BUILTIN

    found: dict[str, str | None] = {"python": platform.python_version(), **{name: version(name) for name in CORE}}
    found["transformer-engine"] = next(filter(None, map(version, TE_NAMES)), None)  # TE ships under several names
    by_name: dict[str, list[dict[str, Any]]] = {}
    for target in BUILTIN:  # each entry of a framework outside CORE, by the file of its watched module
        if target.distribution and target.distribution not in CORE:
            by_name.setdefault(target.distribution, []).append(holder(target.module, target.distribution))
    namesakes = {}
    for name, helds in by_name.items():
        found[name] = next((h["version"] for h in helds if _own(h, name)), None)
        holding = {h["holder"] + " " + h["version"] for h in helds if h["holder"] is not None}
        others = [n for n in dict.fromkeys(n for h in helds for n in h["namesakes"]) if n not in holding]
        if others:
            namesakes[name] = others
    return found, namesakes


def wrapt_ok(found: str | None) -> bool:
    from packaging.specifiers import SpecifierSet

    try:
        return found is not None and SpecifierSet(WRAPT_NEEDED).contains(found)
    except ValueError:  # an unreadable version: say so rather than guess
        return False


def target_row(target: Target, enabled: bool) -> dict[str, Any]:
    """What we can tell about one target without importing it."""
    held = holder(target.module, target.distribution)
    present, own = held["file"] is not None, _own(held, target.distribution)
    others = ", ".join(held["namesakes"])
    unknown = None  # why the release cannot be told from the module file's holder, where it cannot
    if not target.distribution:
        basis = "a TE_OFFLOAD_SHIM_TARGETS entry names no distribution"
    elif not present:
        basis = "not present" + (f"; {others} installed holds no {target.module}" if others else "")
    elif held["holder"] is None:
        basis = unknown = f"no installed distribution holds {held['file']} (a source checkout?)" + (
            f"; {others} installed is another package of that name" if others else ""
        )
    else:
        basis = f"{held['holder']} {held['version']} holds {held['file']}"
        if not own:
            unknown = f"{target.module} is held by {held['holder']} {held['version']}, not by {target.distribution}"
    dist_version = held["version"] if own else None
    fixed, fixed_basis = fixed_upstream(target, dist_version, unknown) if present else (None, "not present")
    supported, supported_basis = in_supported(target, dist_version, unknown) if present else (None, "not present")
    is_disabled = _switches.is_disabled(target.name)
    return {
        "name": target.name,
        "target": target.path,
        # the entry's own declarations, as the table (or TE_OFFLOAD_SHIM_TARGETS) gives them
        **{key: getattr(target, key) for key in ("user", "distribution", "supported", "fixed_in", "note")},
        "present": present,
        "version": dist_version,
        "version_basis": basis,
        "held_by": held["holder"],
        "in_supported": supported,
        "in_supported_basis": supported_basis,
        "fixed_upstream": fixed,
        "fixed_upstream_basis": fixed_basis,
        "disabled": is_disabled,
        "would_be_patched": bool(enabled and present and fixed is not True and not is_disabled),
    }
