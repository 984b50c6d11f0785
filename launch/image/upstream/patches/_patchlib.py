# SPDX-License-Identifier: MIT
"""Anchored, idempotent source patches for the upstream engine image.

Why anchors and not a COPY of finished files: a copied file silently replaces whatever the
base image ships, so a new base keeps serving our stale copy of the old code. Here a patch
names the exact text it rewrites (its anchor, read from the base's installed file) and the
build stops, naming the file and the anchor, when that text is no longer there exactly once.
Run again on a patched file, a patch changes nothing (its marker is there), so rebuilding on
a cached layer or re-running the step is safe.

Stdlib only: it runs under the image's own interpreter (Python 3.12 in vllm/vllm-openai)
and under the test suite's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1  # anchor missing or ambiguous, half-applied file, unreadable file
EXIT_USAGE = 2
EXIT_NOT_APPLIED = 3  # --check on a file the patch has not rewritten


class PatchError(Exception):
    """The file is not what the patch was written against: the build must stop."""


@dataclass(frozen=True)
class Edit:
    """Replace ``anchor`` (exact text, exactly one occurrence) with ``replacement``."""

    anchor: str
    replacement: str


@dataclass(frozen=True)
class Patch:
    """One file's rewrite: its edits, an optional tail of helpers, and a marker line."""

    name: str
    target: str  # the file, relative to site-packages (what --site resolves)
    marker: str  # text only the patched file contains, in every replacement and in append
    edits: tuple[Edit, ...]
    source: str  # where the anchors come from (a public file or doc)
    append: str = ""  # added at the end of the file (the helpers the edits call)

    def pieces(self) -> tuple[str, ...]:
        """Every text a fully patched file contains."""
        tail = (self.append.strip(),) if self.append else ()
        return tuple(e.replacement for e in self.edits) + tail


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), text)


def _telling_line(anchor: str, text: str) -> str:
    """The anchor's first line the file lacks (what changed), else its first line."""
    for line in anchor.splitlines():
        if line.strip() and line.strip() not in text:
            return line.strip()
    return _first_line(anchor)


def is_applied(patch: Patch, text: str, where: str) -> bool:
    """True when ``text`` is fully patched, False when untouched; PatchError when half."""
    if patch.marker not in text:
        return False
    missing = [p for p in patch.pieces() if p not in text]
    if missing:
        raise PatchError(
            f"{patch.name}: {where} carries the marker {patch.marker!r} but not "
            f"{_first_line(missing[0])!r}: partly patched; reinstall the file from the base "
            "image and build again"
        )
    return True


def rewrite(patch: Patch, text: str, where: str) -> str:
    """``text`` with every edit made and the tail appended, or PatchError naming the anchor."""
    for edit in patch.edits:
        n = text.count(edit.anchor)
        if n != 1:
            found = "not found" if n == 0 else f"found {n} times (expected once)"
            raise PatchError(
                f"{patch.name}: anchor {_telling_line(edit.anchor, text)!r} {found} in "
                f"{where}: the base image changed under this patch (anchor source: "
                f"{patch.source}); read the new file, then update or drop the patch"
            )
        text = text.replace(edit.anchor, edit.replacement)
    if patch.append:
        text = text.rstrip("\n") + "\n\n" + patch.append.strip("\n") + "\n"
    return text


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, keeping its mode (a failed write leaves the old)."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".patch")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def apply(patch: Patch, path: Path) -> bool:
    """Patch ``path`` in place; True if it changed, False if it was already patched."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchError(f"{patch.name}: cannot read {path} ({exc.strerror})") from exc
    if is_applied(patch, text, str(path)):
        return False
    new = rewrite(patch, text, str(path))
    if path.suffix == ".py":
        try:
            compile(new, str(path), "exec")
        except SyntaxError as exc:
            raise PatchError(f"{patch.name}: the patched {path} does not compile: {exc}") from exc
    _write_atomically(path, new)
    return True


def _target(patch: Patch, args: argparse.Namespace) -> Path:
    if args.file:
        return Path(args.file)
    return Path(args.site) / patch.target


def main(patch: Patch, argv: list[str] | None = None) -> int:
    """The command line every patch script has: FILE or --site DIR, and --check."""
    parser = argparse.ArgumentParser(
        description=f"Patch {patch.target} (anchors from {patch.source}). Idempotent; "
        "fails when the anchor is gone.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("file", nargs="?", help=f"the installed {patch.target}")
    where.add_argument("--site", help=f"site-packages directory holding {patch.target}")
    parser.add_argument(
        "--check", action="store_true", help="change nothing: exit 0 if patched, 3 if not"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    path = _target(patch, args)
    try:
        if args.check:
            text = path.read_text(encoding="utf-8")
            if is_applied(patch, text, str(path)):
                print(f"[patched] {patch.name}: {path}")
                return EXIT_OK
            print(f"PATCH MISSING {patch.name}: {path} is not patched", file=sys.stderr)
            return EXIT_NOT_APPLIED
        changed = apply(patch, path)
    except PatchError as exc:
        print(f"PATCH FAILED {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"PATCH FAILED {patch.name}: cannot read {path} ({exc.strerror})", file=sys.stderr)
        return EXIT_FAILED
    print(f"[{'applied' if changed else 'already applied'}] {patch.name}: {path}")
    return EXIT_OK
