"""The tar `docker save` writes and `docker load` reads, for the docker stand-ins.

Shaped like docker's own (the OCI layout docker 25+ saves): `oci-layout`, `index.json`,
`manifest.json` (`[{"Config": "blobs/sha256/<hex>", "RepoTags": [...], "Layers": [...]}]`)
and the image config as the blob `blobs/sha256/<hex>`, whose `<hex>` is the image ID. As
in docker, the ID survives the round trip and the registry digests (RepoDigests) do not:
a loaded image has none until it is pushed or pulled. An image saved by digest
(`docker save repo@sha256:D`) is written without a name, so it loads untagged: docker
drops a digest reference from the archive's RepoTags, in the graph-driver store
(moby/moby#22011, "Digest is lost after loading a saved image") and the containerd one
alike (moby/moby#46533: "Don't save image name/reference if it was selected by a digest",
kept for moby's TestSaveLoadNoTag). Unlike docker, the config blob is not re-hashed on load
(the stand-ins' IDs are given, not computed from content).
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import IO, Any

LAYOUT = {"imageLayoutVersion": "1.0.0"}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write(out: IO[bytes], images: list[tuple[str, dict[str, Any]]]) -> None:
    """Write `(ref, image record)` pairs (record: Id, Env, Entrypoint) as a docker-save tar."""
    manifest = []
    with tarfile.open(fileobj=out, mode="w|") as tar:
        _add(tar, "oci-layout", json.dumps(LAYOUT).encode())
        seen: set[str] = set()
        for ref, img in images:
            hexid = img["Id"].removeprefix("sha256:")
            config = {
                "architecture": "arm64",
                "os": "linux",
                "config": {"Env": img.get("Env", []), "Entrypoint": img.get("Entrypoint")},
                "rootfs": {"type": "layers", "diff_ids": []},
            }
            if hexid not in seen:
                _add(tar, f"blobs/sha256/{hexid}", json.dumps(config).encode())
                seen.add(hexid)
            tags = [] if "@" in ref else [ref]  # a digest reference is not saved as a name
            manifest.append({"Config": f"blobs/sha256/{hexid}", "RepoTags": tags, "Layers": []})
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": []}).encode())
        _add(tar, "manifest.json", json.dumps(manifest).encode())


def read(src: IO[bytes]) -> list[tuple[list[str], dict[str, Any]]]:
    """`(names, image record)` for every image in a docker-save tar (names empty: it loads
    untagged); ValueError when the stream is not one."""
    blobs: dict[str, bytes] = {}
    manifest: Any = None
    try:
        with tarfile.open(fileobj=src, mode="r|") as tar:
            for member in tar:
                fh = tar.extractfile(member) if member.isfile() else None
                if fh is None:
                    continue
                data = fh.read()
                if member.name == "manifest.json":
                    manifest = json.loads(data)
                elif member.name.startswith("blobs/sha256/"):
                    blobs[member.name] = data
    except (tarfile.TarError, json.JSONDecodeError) as exc:
        raise ValueError(f"unexpected EOF or not an image archive: {exc}") from None
    if not isinstance(manifest, list):
        raise ValueError("invalid archive: does not contain a manifest.json")
    out = []
    for entry in manifest:
        name = entry.get("Config", "")
        if name not in blobs:
            raise ValueError(f"invalid archive: missing config blob {name}")
        config = json.loads(blobs[name]).get("config") or {}
        record = {
            "Id": "sha256:" + name.rsplit("/", 1)[-1],
            "Env": config.get("Env") or [],
            "Entrypoint": config.get("Entrypoint"),
            "RepoDigests": [],
        }
        out.append(([str(r) for r in entry.get("RepoTags") or []], record))
    return out
