"""Small but real safetensors shards for the model fetch/verify tests (stdlib only).

The layout is huggingface/safetensors' "Format": 8 bytes of header length N (little-endian
u64), N bytes of JSON header, then the tensors' bytes, the last data_offsets end being the
end of the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def shard_bytes(nbytes: int, fill: int = 0, name: str = "w") -> bytes:
    """One uint8 tensor of ``nbytes`` bytes, each ``fill``."""
    header = {name: {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes([fill]) * nbytes


def write_checkpoint(root: Path, names: list[str], nbytes: int = 4096) -> None:
    """``config.json``, the shards and the index that names them, under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "deepseek_v4"}')
    for i, name in enumerate(names):
        (root / name).write_bytes(shard_bytes(nbytes + i, fill=i, name=f"t{i}.weight"))
    wmap = {f"t{i}.weight": name for i, name in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
