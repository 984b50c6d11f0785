"""Image references checked as docker reads them, before any node is asked.

docker's client parses every reference it is given (``docker pull``, ``run``, ``save``,
``tag``) with distribution/reference's ``ParseNormalizedNamed`` (normalize.go), whose grammar
is the regular expressions of regexp.go and whose limits and errors are reference.go's;
the digest is go-digest's (opencontainers/go-digest, algorithm.go). The grammar below
restates those (a name of lower-case path components, optionally after a registry host;
a tag; a digest), so ``IMAGE=upper/Case:tag`` is a config error naming docker's own
reason, not a ``docker run`` that fails on both nodes later. One case docker accepts is
refused as well, because it never means what was written: an upper-case first component
without a dot or a port (``UPPER/case:tag``) is read by docker as a registry *host*
(normalize.go, splitDockerDomain), so docker would try to reach a machine named ``UPPER``.
"""

from __future__ import annotations

import re

# regexp.go: the atoms, each written out as the library spells it.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_HOST = rf"(?:{_DOMAIN_NAME}|\[(?:[a-fA-F0-9:]+)\])"
_DOMAIN_AND_PORT = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"  # Go's \w is ASCII: hence re.ASCII below
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME}"
REFERENCE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
NAME = re.compile(rf"(?:({_DOMAIN_AND_PORT})/)?({_REMOTE_NAME})", re.ASCII)
IDENTIFIER = re.compile(r"[a-f0-9]{64}")
# reference.go RepositoryNameTotalLengthMax: the path, without the registry host.
PATH_MAX = 255
# go-digest: the algorithms docker knows and the hex length of each.
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}

LOCALHOST = "localhost"
HUB = "docker.io"


def split_domain(ref: str) -> tuple[str, str, bool]:
    """(registry host, the rest, whether capitals alone made the first part a host), as
    normalize.go's splitDockerDomain decides: a first component is a host when it is
    ``localhost``, has a '.' or a ':', or has an upper-case letter."""
    first, slash, rest = ref.partition("/")
    if not slash:
        return HUB, "library/" + ref, False
    if first == LOCALHOST or any(c in first for c in ".:"):
        return first, rest, False
    if first.lower() != first:
        return first, rest, True
    return HUB, ref, False


def _digest_problem(digest: str) -> str | None:
    algorithm, _, hexpart = digest.partition(":")
    want = DIGEST_HEX.get(algorithm)
    if want is None:
        return f"unsupported digest algorithm {algorithm!r} (sha256, sha384 or sha512)"
    if len(hexpart) != want:
        return f"invalid checksum digest length ({algorithm} has {want} hex digits)"
    if hexpart != hexpart.lower():
        return "invalid checksum digest format (lower-case hex)"
    return None


def problem(ref: str) -> str | None:
    """Why docker refuses ``ref`` or would read it as something else (None when fine)."""
    if not ref:
        return "is empty"
    if IDENTIFIER.fullmatch(ref):
        return "is an image ID, not a name: docker cannot pull or tag 64-hex strings; name it"
    domain, rest, capitals_host = split_domain(ref)
    remote = rest.partition(":")[0]
    if remote.lower() != remote:
        return f"is refused by docker: repository name ({remote}) must be lowercase"
    full = f"{domain}/{rest}"
    m = REFERENCE.fullmatch(full)
    if m is None:
        if REFERENCE.fullmatch(full.lower()):
            return "is refused by docker: repository name must be lowercase"
        return (
            "is refused by docker: invalid reference format (NAME[:TAG][@sha256:DIGEST]; "
            "lower-case name components, a tag of up to 128 letters, digits, '_', '.', '-')"
        )
    name = NAME.fullmatch(m.group(1))
    path = name.group(2) if name else m.group(1)
    if len(path) > PATH_MAX:
        return f"is refused by docker: repository name must not be more than {PATH_MAX} characters"
    if m.group(3):
        why = _digest_problem(m.group(3))
        if why:
            return f"is refused by docker: {why}"
    if capitals_host:
        first, _, rest = ref.partition("/")
        return (
            f"would send docker to a registry host named {first!r} (a first part with capitals "
            f"is read as a host); Docker Hub names are lower-case ({first.lower()}/{rest}), "
            "and a registry host has a '.' or a ':port'"
        )
    return None
