"""Overlay distribution: copy what the overlay plugin ships to OVERLAY_DIR on both nodes.

What ships is listed once, in the plugin's own folder: the ``ship`` globs of the
``[tool.dsv4-flash-overlays]`` table in mods/dsv4-flash-overlays/pyproject.toml. ``sync``
copies exactly those files and preflight's PF-OVERLAYS compares exactly those, so a bench
result or an egg-info left in the folder neither travels nor makes preflight WARN. The list
is data, not code: pairctl runs on the rank-0 host, where the plugin is not installed (it
is mounted into the containers), and reads it with tomllib without importing the plugin.

The copy is staged next to the target, checked file by file (sha256) on arrival, and only
then swapped in, so a node never runs a half-copied overlay.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from pairctl.nodes.ssh import Node
from pairctl.pair.config import ConfigError

MANIFEST_FILE = "pyproject.toml"
MANIFEST_TABLE = "dsv4-flash-overlays"


class ManifestError(ConfigError):
    """The overlay folder's ship list is missing, malformed or names a file that is not there."""


def ship_list(src: Path) -> list[str]:
    """Relative paths of the files the overlay folder ``src`` ships, sorted."""
    manifest = src / MANIFEST_FILE
    fix = f"list what ships as [tool.{MANIFEST_TABLE}] ship = [globs] in {manifest}"
    try:
        data = tomllib.loads(manifest.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{manifest}: {exc}; {fix}") from exc
    globs = data.get("tool", {}).get(MANIFEST_TABLE, {}).get("ship")
    if not isinstance(globs, list) or not globs or not all(isinstance(g, str) for g in globs):
        raise ManifestError(f"{manifest}: no ship list; {fix}")
    files: set[str] = set()
    for pattern in globs:
        hits = [p for p in src.glob(pattern) if p.is_file()]
        if not hits:
            raise ManifestError(
                f"{manifest}: ship entry {pattern!r} matches no file in {src}; "
                "restore the file or fix the entry"
            )
        files.update(p.relative_to(src).as_posix() for p in hits)
    return sorted(files)


def shipped_files(src: Path) -> dict[str, str]:
    """sha256 of every file ``src`` ships, keyed by relative path (what sync verifies)."""
    return {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest() for rel in ship_list(src)}


def build_tar(src: Path, files: list[str]) -> bytes:
    """An uncompressed tar of ``files`` (relative to ``src``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in files:
            tar.add(src / rel, arcname=rel, recursive=False)
    return buf.getvalue()


def remote_script(dest: str) -> str:
    """Unpack stdin into a staging dir, print its checksums; the swap happens later."""
    stage = shlex.quote(dest + ".sync-stage")
    return (
        f"set -e; rm -rf {stage}; mkdir -p {stage}; tar -C {stage} -xf -; "
        f"cd {stage}; find . -type f -exec sha256sum {{}} +"
    )


def swap_script(dest: str) -> str:
    d, stage, old = (shlex.quote(dest + s) for s in ("", ".sync-stage", ".sync-old"))
    return (
        f"set -e; rm -rf {old}; if [ -e {d} ]; then mv {d} {old}; fi; mv {stage} {d}; rm -rf {old}"
    )


def parse_sums(text: str) -> dict[str, str]:
    """``sha256sum`` output → {relative path: digest}."""
    out = {}
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if digest:
            out[name.strip().lstrip("*").removeprefix("./")] = digest
    return out


def verify(want: dict[str, str], have: dict[str, str]) -> list[str]:
    """Problems between the source manifest and what arrived (empty = intact)."""
    probs = [f"missing {k}" for k in sorted(set(want) - set(have))]
    probs += [f"checksum mismatch {k}" for k in sorted(set(want) & set(have)) if want[k] != have[k]]
    probs += [f"unexpected {k}" for k in sorted(set(have) - set(want))]
    return probs


def sync_node(node: Node, dest: str, payload: bytes, want: dict[str, str]) -> str:
    """Copy + verify + swap on one node; returns '' on success or the problem."""
    res = node.run(["sh", "-c", remote_script(dest)], timeout=120, stdin=payload)
    if res.rc != 0:
        return f"copy failed (rc={res.rc}): {res.err.strip()[-300:]}"
    probs = verify(want, parse_sums(res.out))
    if probs:
        return "arrived corrupted: " + "; ".join(probs[:5])
    res = node.run(["sh", "-c", swap_script(dest)], timeout=60)
    if res.rc != 0:
        return f"swap failed (rc={res.rc}): {res.err.strip()[-300:]}"
    return ""


def sync(node_list: Sequence[Node], overlay_dir: str, src: Path) -> int:
    """Sync both nodes' ``overlay_dir``; 0 when both arrived intact, 1 otherwise."""
    if not (src / "dsv4_flash_overlays").is_dir():
        print(f"sync: {src} does not look like the overlay package", flush=True)
        return 1
    try:
        want = shipped_files(src)
    except ManifestError as exc:
        print(f"sync: {exc}", flush=True)
        return 1
    payload = build_tar(src, sorted(want))
    rc = 0
    for node in node_list:
        problem = sync_node(node, overlay_dir, payload, want)
        if problem:
            print(f"sync: {node.label}: {overlay_dir}: {problem}", flush=True)
            rc = 1
        else:
            print(
                f"sync: {node.label}: {overlay_dir}: {len(want)} files, sha256 verified",
                flush=True,
            )
    return rc
