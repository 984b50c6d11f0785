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
