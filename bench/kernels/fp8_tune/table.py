# SPDX-License-Identifier: MIT
"""Writing the tuned table (``fp8_configs.json``), and recording how it was made.

The table ships to every Spark, so what it records must make sense on any machine: a
command line is stored as ``python -m MODULE ARGS`` with every absolute path in ARGS made
relative to the clone (inside it) or cut to its file name (outside it, e.g. a scratch
directory of the machine that tuned). ``merge_into_file`` applies the same rule to any
``command`` it is given, so no caller can put a build machine's path into the table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from dsv4_flash_overlays.fp8_head.configs import SCHEMA_VERSION

from pairctl.home import project_root

# the root of the clone (pairctl.home)
REPO_ROOT = project_root()
TUNE_MODULE = "bench.kernels.fp8_tune"
NOTE = (
    f"written by python -m {TUNE_MODULE}; keys are "
    "'<torch device name>|N=<rows>|K=<cols>'; per M: the fastest accurate path"
)


def portable_path(arg: str, root: Path = REPO_ROOT) -> str:
    """``arg`` without the machine it ran on: an absolute path inside ``root`` becomes
    relative to it, any other absolute path its file name; ``--opt=/a/b`` likewise on the
    value. Anything that is not an absolute path is returned unchanged."""
    if arg.startswith("-") and "=" in arg:
        opt, _, value = arg.partition("=")
        return f"{opt}={portable_path(value, root)}"
    if not arg.startswith("/"):
        return arg
    norm = os.path.normpath(arg)
    base = os.path.normpath(str(root))
    if norm == base:
        return "."
    if norm.startswith(base + os.sep):
        return PurePosixPath(os.path.relpath(norm, base)).as_posix()
    return PurePosixPath(norm).name or arg


def portable_command(module: str, argv: Sequence[str], root: Path = REPO_ROOT) -> str:
    """``python -m MODULE ARGS`` for the arguments ``argv`` (``sys.argv[1:]``): what an
    operator types in a clone, not the interpreter and script paths of this machine."""
    return " ".join(["python", "-m", module, *(portable_path(a, root) for a in argv)])


def portable_text(command: str, root: Path = REPO_ROOT) -> str:
    """A recorded command line (space-separated) with ``portable_path`` on every word."""
    return " ".join(portable_path(word, root) for word in command.split(" "))


def _portable_meta(meta: dict[str, Any], root: Path) -> dict[str, Any]:
    out = {}
    for key, value in meta.items():
        if isinstance(value, dict) and isinstance(value.get("command"), str):
            value = {**value, "command": portable_text(value["command"], root)}
        out[key] = value
    return out


def merge_into_file(
    path: Path,
    entries: dict[str, dict[str, Any]],
    meta: dict[str, Any] | None = None,
    root: Path = REPO_ROOT,
) -> dict[str, Any]:
    """Write ``entries`` (key -> {M: choice json}) into the table file, keeping other keys.

    A key written here replaces that key's whole entry (a re-tune is one consistent set of
    measurements); other GPUs' and shapes' entries stay as they were. Every ``command`` in
    the file's ``meta``, old or new, is stored without absolute paths (``portable_text``).
    """
    data = json.loads(path.read_text()) if path.exists() else {}
    old = data.get("entries", {})
    for key, entry in entries.items():
        old[key] = dict(sorted(entry.items(), key=lambda kv: int(kv[0])))
    merged_meta = _portable_meta({**data.get("meta", {}), **(meta or {})}, root)
    out = {
        "schema_version": SCHEMA_VERSION,
        "note": NOTE,
        "entries": dict(sorted(old.items())),
        "meta": dict(sorted(merged_meta.items())),
    }
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out
