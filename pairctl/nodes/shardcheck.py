"""Is a safetensors shard whole? Its own header says how long it must be.

A shard cut short (a download or a copy that stopped, a disk that filled) or left empty
has a size no index records: ``model.safetensors.index.json`` maps tensors to files and
gives no file sizes, and the Hugging Face download metadata holds a commit and an etag,
not a length. The file itself does: safetensors is 8 bytes of N (little-endian u64),
N bytes of JSON header whose tensors carry ``data_offsets`` [begin, end) into the byte
buffer that follows, and the last offset must be the end of the file (huggingface/safetensors
README "Format"; its loader refuses anything else as ``MetadataIncompleteBuffer``). Reading
8 + N bytes per shard (kilobytes) finds a truncated 5 GB shard without reading it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# The format's own cap on the header (huggingface/safetensors README: N < 100 MB).
MAX_HEADER = 100_000_000


def expected_size(path: Path) -> int:
    """The size the shard's header promises; ValueError saying why when it has none."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{len(head)} bytes: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise ValueError(f"header length {n} is not a safetensors header")
        raw = fh.read(n)
    if len(raw) < n:
        raise ValueError(f"ends inside its {n}-byte header")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("its header is not JSON: not a safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object: not a safetensors file")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"tensor {name!r} has no data_offsets")
        end = max(end, int(offsets[1]))
    return 8 + n + end


def shard_problem(path: Path) -> str | None:
    """Why the shard at ``path`` is not whole (None when its size is what it promises)."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    try:
        want = expected_size(path)
    except ValueError as exc:
        return str(exc)
    if size < want:
        return f"is {size} bytes, its safetensors header says {want}: cut short"
    if size > want:
        return f"is {size} bytes, its safetensors header says {want}: bytes past its end"
    return None
