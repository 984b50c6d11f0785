"""PEP 440 versions and specifiers, as far as judging an image's components needs them.

Preflight compares what an image really carries (torch ``2.13.0+cpu``, NCCL ``2.28.9``, vLLM
``0.21.1rc1.dev339+g1967a5627bc3``) with a stack's known-bad list (``==2.28.9``, ``<2.30``)
and with the torch requirement vLLM's own metadata declares (``torch==2.14.0``). pairctl
installs no ``packaging``, so this is the part of PEP 440 (peps.python.org/pep-0440) those
comparisons use: the version grammar with its normalisations, the ordering (dev < pre <
final < post; a local label sorts after its public version), and the specifier operators
``== != < <= > >= ~= ===`` including ``==X.*``. Pre-releases always count as matching: the
question is "does this installed version fall in a bad range", not "which one to install".
tests/test_pep440.py checks every answer against ``packaging`` where it is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

# The version grammar of PEP 440's appendix "Parsing version strings with regular
# expressions", written out here: epoch, release, pre, post (also the implicit "-N"), dev,
# local; separators and spellings (alpha, c, rev, ...) are normalised below.
_VERSION_RE = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc"}
_PRE["rc"] = "rc"
_SPEC_RE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*(\S+)\s*$")
OPERATORS = ("===", "==", "!=", "~=", "<=", ">=", "<", ">")


class InvalidVersion(ValueError):
    """Not a PEP 440 version (or specifier)."""


def _strip_zeros(release: tuple[int, ...]) -> tuple[int, ...]:
    out = list(release)
    while len(out) > 1 and out[-1] == 0:
        out.pop()
    return tuple(out)


@total_ordering
@dataclass(frozen=True)
class Version:
    """A parsed version; ordering and equality follow PEP 440 (``1.0 == 1.0.0``)."""

    epoch: int
    release: tuple[int, ...]
    pre: tuple[str, int] | None
    post: int | None
    dev: int | None
    local: tuple[int | str, ...] | None

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def public(self) -> Version:
        """The same version without its local label (``2.13.0+cpu`` -> ``2.13.0``)."""
        return Version(self.epoch, self.release, self.pre, self.post, self.dev, None)

    @property
    def base(self) -> tuple[int, tuple[int, ...]]:
        """Epoch and release only (``1.0.post1`` and ``1.0rc1`` share ``1.0``'s)."""
        return (self.epoch, _strip_zeros(self.release))

    def _key(self) -> tuple:
        # dev of a final release sorts before its pre-releases; no pre sorts after them
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple = (-1, "", 0)
        elif self.pre is None:
            pre = (1, "", 0)
        else:
            pre = (0, *self.pre)
        post = (-1,) if self.post is None else (0, self.post)
        dev = (1, 0) if self.dev is None else (0, self.dev)
        if self.local is None:
            local: tuple = ()
        else:
            # numeric segments sort after alphanumeric ones, and compare as numbers
            local = tuple((1, p, "") if isinstance(p, int) else (0, 0, p) for p in self.local)
        return (self.epoch, _strip_zeros(self.release), pre, post, dev, local)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        out = f"{self.epoch}!" if self.epoch else ""
        out += ".".join(str(n) for n in self.release)
        if self.pre:
            out += f"{self.pre[0]}{self.pre[1]}"
        if self.post is not None:
            out += f".post{self.post}"
        if self.dev is not None:
            out += f".dev{self.dev}"
        if self.local:
            out += "+" + ".".join(str(p) for p in self.local)
        return out


def parse(text: str) -> Version:
    """A version string -> Version; raises InvalidVersion."""
    m = _VERSION_RE.match(text or "")
    if not m:
        raise InvalidVersion(f"not a PEP 440 version: {text!r}")
    pre = None
    if m["pre_l"]:
        pre = (_PRE[m["pre_l"].lower()], int(m["pre_n"] or 0))
    post = None
    if m["post_n1"] is not None:
        post = int(m["post_n1"])
    elif m["post_l"]:
        post = int(m["post_n2"] or 0)
    dev = int(m["dev_n"] or 0) if m["dev_l"] else None
    local = None
    if m["local"]:
        parts = re.split(r"[-_.]", m["local"].lower())
        local = tuple(int(p) if p.isdigit() else p for p in parts)
    return Version(
        int(m["epoch"] or 0),
        tuple(int(n) for n in m["release"].split(".")),
        pre,
        post,
        dev,
        local,
    )


def valid(text: str) -> bool:
    try:
        parse(text)
    except InvalidVersion:
        return False
    return True


def _prefix_match(v: Version, prefix: str) -> bool:
    """``==X.Y.*``: same epoch, release starting with X.Y (the candidate's zeros padded)."""
    want = parse(prefix)
    if want.pre or want.post is not None or want.dev is not None or want.local:
        raise InvalidVersion(f"==*: only a release prefix is supported, not {prefix!r}")
    n = len(want.release)
    have = v.release + (0,) * max(0, n - len(v.release))
    return v.epoch == want.epoch and have[:n] == want.release


def _one(v: Version, raw: str, op: str, text: str) -> bool:
    if op == "===":
        return raw.strip().lower() == text.lower()
    if op in ("==", "!=") and text.endswith(".*"):
        hit = _prefix_match(v, text[:-2])
        return hit if op == "==" else not hit
    spec = parse(text)
    if op in ("==", "!="):
        cand = v if spec.local is not None else v.public
        return (cand == spec) if op == "==" else (cand != spec)
    if spec.local is not None:
        raise InvalidVersion(f"a local version is not allowed with {op}: {text!r}")
    cand = v.public
    if op == "<=":
        return cand <= spec
    if op == ">=":
        return cand >= spec
    if op == "<":
        # <V excludes V's own pre-releases unless V is one
        if cand >= spec:
            return False
        return spec.is_prerelease or not (cand.is_prerelease and cand.base == spec.base)
    if op == ">":
        # >V excludes V's post-releases unless V is one
        if cand <= spec:
            return False
        return spec.post is not None or not (cand.post is not None and cand.base == spec.base)
    if op == "~=":
        if len(spec.release) < 2:
            raise InvalidVersion(f"~= needs at least two release segments: {text!r}")
        prefix = ".".join(str(n) for n in spec.release[:-1])
        return cand >= spec and _prefix_match(cand, f"{spec.epoch}!{prefix}")
    raise InvalidVersion(f"unknown operator {op!r}")


def is_specifier(text: str) -> bool:
    """True when ``text`` starts with a PEP 440 operator (``==2.28.9``, ``<2.30,>=2.27``)."""
    return text.strip().startswith(OPERATORS)


def check_specifiers(specifiers: str) -> None:
    """Raise InvalidVersion unless every comma-separated part is a PEP 440 specifier."""
    for part in (p for p in specifiers.split(",") if p.strip()):
        m = _SPEC_RE.match(part)
        if not m:
            raise InvalidVersion(f"not a PEP 440 specifier: {part.strip()!r}")
        if m[1] != "===":
            _one(parse("0"), "0", m[1], m[2])  # parses the version, checks the operator's rules


def contains(version: str, specifiers: str) -> bool:
    """Does ``version`` satisfy every comma-separated specifier? Raises InvalidVersion
    when either side is not PEP 440."""
    v = parse(version)
    parts = [p for p in specifiers.split(",") if p.strip()]
    if not parts:
        return True
    for part in parts:
        m = _SPEC_RE.match(part)
        if not m:
            raise InvalidVersion(f"not a PEP 440 specifier: {part.strip()!r}")
        if not _one(v, version, m[1], m[2]):
            return False
    return True


def matches(version: str, pattern: str) -> bool:
    """A stack's version pattern: specifiers when it starts with an operator, else the exact
    version (PEP 440 equality when both parse, ``2.28.9`` == ``2.28.9.0``; plain string
    equality for a non-version value such as ``missing``)."""
    if is_specifier(pattern):
        try:
            return contains(version, pattern)
        except InvalidVersion:
            return False
    try:
        return parse(version) == parse(pattern)
    except InvalidVersion:
        return version.strip() == pattern.strip()
