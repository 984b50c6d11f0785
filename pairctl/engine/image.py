"""What the container image brings with it: its ID, registry digests, env and entrypoint.

Read from ``docker image inspect IMAGE`` on each node (the probe for preflight, and
``start`` right before ``docker run``), because two things in the generated line depend on
the image: an image built on vllm-openai has ``ENTRYPOINT ["vllm", "serve"]`` (so the
launcher sets ``--entrypoint`` itself), and an image may set ``PYTHONPATH`` for its own
packages (so the overlay path is appended to it, never put in its place).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ImageFacts:
    """One node's view of IMAGE (``docker image inspect``); empty when it was not read."""

    id: str = ""
    repo_digests: list[str] = field(default_factory=list)  # "repo@sha256:..." per registry
    env: list[str] = field(default_factory=list)  # Config.Env, "K=V" each
    entrypoint: list[str] | None = None  # Config.Entrypoint (None: the image sets none)

    def env_value(self, key: str) -> str | None:
        """The image's value of ``key`` (last one wins, as in docker), or None."""
        value = None
        for item in self.env:
            k, eq, v = item.partition("=")
            if eq and k == key:
                value = v
        return value

    def digests(self) -> set[str]:
        """The ``sha256:...`` parts of the registry digests."""
        return {d.rpartition("@")[2] for d in self.repo_digests if "@" in d}


def parse_inspect(text: str) -> ImageFacts | None:
    """``docker image inspect IMAGE`` output (a JSON array) → the first image's facts."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(data, list):
        data = data[0] if data else None
    if not isinstance(data, dict):
        return None
    config = data.get("Config") or {}
    entry = config.get("Entrypoint")
    return ImageFacts(
        id=str(data.get("Id") or ""),
        repo_digests=[str(d) for d in data.get("RepoDigests") or []],
        env=[str(e) for e in config.get("Env") or []],
        entrypoint=[str(e) for e in entry] if isinstance(entry, list) else None,
    )


def pythonpath(image: ImageFacts | None, overlay_path: str) -> str:
    """PYTHONPATH for the container: the image's own, then the overlays (appended)."""
    base = image.env_value("PYTHONPATH") if image else None
    return f"{base}:{overlay_path}" if base else overlay_path


def digest_pinned(ref: str) -> bool:
    """True when an image reference names its content (``repo@sha256:...``)."""
    return "@sha256:" in ref


# The tag `image ship` gives a digest-pinned IMAGE on rank 1. `docker save repo@sha256:D`
# writes the image without a name (moby/moby#22011; moby/moby#46533 keeps that for the
# containerd store), so `docker load` on rank 1 gives an untagged image that `repo@sha256:D`
# does not find (its RepoDigests stay empty until a pull), and `docker tag` refuses a digest
# as the target ("refusing to create a tag with a digest reference", moby client
# image_tag.go). So rank 1 names it `repo:pinned-D`, derived from IMAGE alone (plan shows
# it without asking a node); PF-IMAGE-MATCH still compares the image IDs, so a tag moved
# by hand is caught before `up` uses it.
PINNED_TAG_PREFIX = "pinned-"


def pinned_tag(ref: str) -> str:
    """``repo[:tag]@sha256:D`` → ``repo:pinned-D``; any other reference unchanged."""
    if not digest_pinned(ref):
        return ref
    name, _, digest = ref.partition("@")
    head, slash, last = name.rpartition("/")
    repo = f"{head}{slash}{last.partition(':')[0]}"
    return f"{repo}:{PINNED_TAG_PREFIX}{digest.removeprefix('sha256:')}"


def node_ref(ref: str, rank: int) -> str:
    """The reference of IMAGE on one rank's node: IMAGE itself, except a headless rank's
    local name for a digest-pinned IMAGE (``pinned_tag``), which `image ship` tags after
    the load."""
    return pinned_tag(ref) if rank != 0 else ref
