"""Overlay distribution: copy mods/dsv4-flash-overlays/ to OVERLAY_DIR on both nodes.

The copy is staged next to the target, checked file by file (sha256) on arrival, and only
then swapped in, so a node never runs a half-copied overlay. The same exclusion rule as
preflight's PF-OVERLAYS comparison applies (no __pycache__, *.pyc, *.egg-info, build/).
"""

from __future__ import annotations

import io
import shlex
import tarfile
from pathlib import Path

from pairctl.config import PairConfig
from pairctl.nodes import Node, nodes
from pairctl.preflight import local_overlay_files, overlay_excluded


def build_tar(src: Path) -> bytes:
    """An uncompressed tar of the overlay package (excluded files left out)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src)
            if p.is_file() and not overlay_excluded(rel):
                tar.add(p, arcname=str(rel), recursive=False)
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


def sync_node(node: Node, src: Path, dest: str, payload: bytes, want: dict[str, str]) -> str:
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


def sync(cfg: PairConfig, src: Path) -> int:
    """Sync both nodes; 0 when both arrived intact, 1 otherwise."""
    if not (src / "dsv4_flash_overlays").is_dir():
        print(f"sync: {src} does not look like the overlay package", flush=True)
        return 1
    want = local_overlay_files(src)
    payload = build_tar(src)
    rc = 0
    for node in nodes(cfg):
        problem = sync_node(node, src, cfg.OVERLAY_DIR, payload, want)
        if problem:
            print(f"sync: {node.label}: {cfg.OVERLAY_DIR}: {problem}", flush=True)
            rc = 1
        else:
            print(
                f"sync: {node.label}: {cfg.OVERLAY_DIR}: {len(want)} files, sha256 verified",
                flush=True,
            )
    return rc
