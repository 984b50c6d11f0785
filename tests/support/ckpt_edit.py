"""A copy of a safetensors checkpoint with some tensors removed: the field's fault on disk.

The weight guard's engine tests serve such a copy: the tensors are gone from the
safetensors files and from ``model.safetensors.index.json`` if the checkpoint has one, as
when a converter or a partial download loses them. Everything else is copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

INDEX = "model.safetensors.index.json"


def copy_without(src: Path, dst: Path, drop: set[str]) -> Path:
    """``src`` copied to ``dst`` without the tensors ``drop``; KeyError names one not there."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=False)
    found: set[str] = set()
    for f in sorted(src.iterdir()):
        if f.name.startswith(".") or f.is_dir():
            continue
        if f.suffix != ".safetensors":
            if f.name != INDEX:
                shutil.copy2(f, dst / f.name)
            continue
        with safe_open(str(f), framework="pt") as st:
            meta = st.metadata()
            keys = list(st.keys())
            kept = {k: st.get_tensor(k) for k in keys if k not in drop}
        found |= set(keys) & drop
        save_file(kept, str(dst / f.name), metadata=meta)
    if (src / INDEX).is_file():
        index = json.loads((src / INDEX).read_text())
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in drop}
        (dst / INDEX).write_text(json.dumps(index, indent=2))
    if found != drop:
        raise KeyError(f"not in {src}: {', '.join(sorted(drop - found))}")
    return dst
