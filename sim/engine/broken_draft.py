"""A draft model for the real CPU engine whose weights were not loaded: the tiny model
(sim/engine/tiny_model.py) with named tensors zeroed.

The field's silent fault is a draft whose tensors a loader skipped ("Patch 4":
tonyd2wild/DeepSeek-v4-Flash-0731-DSpark-1M-NVFP4-KV-2x-DGX-Spark, eugr/spark-vllm-docker
#331): the parameters keep what they were allocated with, the target model is untouched, so
the output is the same and only the drafts go wrong. vLLM 0.32's CPU engine runs a draft
model (``--speculative-config '{"method": "draft_model", "model": DIR, ...}'``,
vllm/v1/worker/cpu_model_runner.py "Draft model KV cache initialized for CPU backend"); the
tiny model as its own draft is a perfect one (greedy: every draft accepted), and the same
files with ``model.embed_tokens.weight`` at zero stand for a draft whose embedding was never
filled: each of its hidden states is 0, it proposes the same token every time, and nearly
every draft is rejected at position 0. Zero rather than torch.empty's leftovers, so that the
broken draft is the same on every run.

Runs in the engine's venv (safetensors, torch):
``.venv-engine/bin/python -m sim.engine.broken_draft SRC DST [TENSOR ...]``; prints DST.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

DEFAULT_DROPPED = ("model.embed_tokens.weight",)


def write(src: Path, dst: Path, dropped: tuple[str, ...] = DEFAULT_DROPPED) -> Path:
    """``dst``: a copy of the model in ``src`` with the ``dropped`` tensors zeroed."""
    from safetensors.torch import load_file, save_file

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    left = set(dropped)
    for f in sorted(dst.glob("*.safetensors")):
        tensors = load_file(str(f))
        for name in left & set(tensors):
            tensors[name] = tensors[name].zero_()
            left.discard(name)
        save_file(tensors, str(f), metadata={"format": "pt"})
    if left:
        raise SystemExit(f"{src}: no tensor named {', '.join(sorted(left))}")
    return dst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("tensors", nargs="*", default=list(DEFAULT_DROPPED))
    a = p.parse_args(argv)
    print(write(a.src, a.dst, tuple(a.tensors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
