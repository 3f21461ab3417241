"""Version specifiers of the target table (`supported=">=0.4.0,<0.9.0"`), matched exactly.

The package depends on wrapt alone, so `packaging` cannot be assumed at run time; this is the
subset of PEP 440 the table uses, written out:

- a specifier set is comma-joined clauses `OP VERSION`, OP one of `>=, <=, >, <, ==, !=, ~=`;
  the VERSION of a clause is a plain dotted release (`0.9.0`): a clause with a pre/post/dev/local
  suffix, an epoch or a `.*` wildcard is refused with a ValueError, as is an empty set (which would
  match everything).
- the installed version may carry any PEP 440 suffix (`0.9.0rc1`, `1.0.post2`, `0.8.0.dev0+g1a2b`);
  it is ordered as PEP 440 orders it, and matched as PEP 440 matches an already-installed release
  (pre-releases count): the local label is ignored, `<V` does not match V's own pre- and
  dev-releases, `>V` does not match V's post-releases, `~=X.Y` is `>=X.Y, ==X.*`.

tests/integrations/test_target_table.py checks these rules against `packaging` (a test-time dependency of pytest).
Imported by `te-offload-shim status` and the tests, never at `import te_offload_shim`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

OPERATORS = (">=", "<=", "!=", "==", "~=", ">", "<")  # two-character ones first: the parser takes a prefix

_RELEASE = re.compile(r"\d+(?:\.\d+)*")
# Normalised and the common unnormalised spellings (PEP 440 "Normalization"), case-insensitive.
_VERSION = re.compile(
    r"""v?(?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?:-(?P<post_implicit>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>\d*))?
    (?:[-_.]?dev[-_.]?(?P<dev_n>\d*))?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?""",
    re.VERBOSE | re.IGNORECASE,
)
_PHASE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_FINAL = 3


class Version(NamedTuple):
    """A parsed version; `key` orders it as PEP 440 does (the local label plays no part)."""

    release: tuple[int, ...]
    pre: tuple[int, int] | None  # (phase: a=0, b=1, rc=2, number)
    post: int | None
    dev: int | None
    local: str | None

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, int], int, tuple[int, int]]:
        release = self.release
        while len(release) > 1 and release[-1] == 0:  # 1.0 == 1.0.0
            release = release[:-1]
        if self.pre is not None:
            pre = self.pre
        elif self.dev is not None and self.post is None:
            pre = (-1, 0)  # 1.0.dev0 sorts before 1.0a1
        else:
            pre = (_FINAL, 0)
        post = -1 if self.post is None else self.post
        dev = (1, 0) if self.dev is None else (0, self.dev)  # a dev release sorts before its base
        return release, pre, post, dev

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None


def parse_version(text: str) -> Version:
    """An installed version string; ValueError when it is not PEP 440."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a PEP 440 version")
    g = match.groupdict()
    pre = None
    if g["pre_l"]:
        pre = (_PHASE[g["pre_l"].lower()], int(g["pre_n"] or 0))
    post = None
    if g["post_implicit"] is not None:
        post = int(g["post_implicit"])
    elif g["post_n"] is not None:
        post = int(g["post_n"] or 0)
    dev = None if g["dev_n"] is None else int(g["dev_n"] or 0)
    release = tuple(int(p) for p in g["release"].split("."))
    return Version(release, pre, post, dev, g["local"])


class Clause(NamedTuple):
    op: str
    version: Version
    text: str

    def matches(self, candidate: Version) -> bool:
        mine, spec = candidate.key, self.version.key
        op = self.op
        if op == "==":
            return mine == spec
        if op == "!=":
            return mine != spec
        if op == ">=":
            return mine >= spec
        if op == "<=":
            return mine <= spec
        if op == "<":
            # `<0.9.0` does not match 0.9.0rc1 nor 0.9.0.dev0: they are releases *of* 0.9.0
            return mine < spec and not (candidate.is_prerelease and _same_release(candidate, self.version))
        if op == ">":
            # `>0.9.0` does not match 0.9.0.post1 (a post-release of 0.9.0)
            return mine > spec and not (candidate.post is not None and _same_release(candidate, self.version))
        # ~=X.Y.Z: >= X.Y.Z and the same X.Y
        prefix = self.version.release[:-1]
        padded = candidate.release + (0,) * max(0, len(prefix) - len(candidate.release))
        return mine >= spec and padded[: len(prefix)] == prefix


def _same_release(a: Version, b: Version) -> bool:
    return a.key[0] == b.key[0]


class SpecifierSet:
    """Comma-joined clauses, all of which a version must match."""

    __slots__ = ("clauses", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.clauses = tuple(_parse_clause(part, text) for part in text.split(","))

    def __repr__(self) -> str:
        return f"SpecifierSet({self.text!r})"

    def __contains__(self, version: str | Version) -> bool:
        candidate = parse_version(version) if isinstance(version, str) else version
        return all(clause.matches(candidate) for clause in self.clauses)


def _parse_clause(part: str, whole: str) -> Clause:
    clause = part.strip()
    op = next((o for o in OPERATORS if clause.startswith(o)), None)
    if op is None:
        raise ValueError(f"bad specifier {whole!r}: {clause!r} does not start with one of {' '.join(OPERATORS)}")
    number = clause[len(op) :].strip()
    if not _RELEASE.fullmatch(number):
        raise ValueError(
            f"bad specifier {whole!r}: {clause!r} must name a plain dotted release such as 0.9.0 "
            "(no pre/post/dev/local suffix, epoch or wildcard)"
        )
    if op == "~=" and "." not in number:
        raise ValueError(f"bad specifier {whole!r}: {clause!r} needs at least two components (~=1.4)")
    return Clause(op, parse_version(number), clause)
