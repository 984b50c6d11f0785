"""`vllm serve` for the rehearsal's real-engine image: exec the engine venv's real vLLM.

The rehearsal runtime's `vllm` (sim/rehearsal/bin/vllm) runs this in the engine venv when
the pair's image is the CPU-engine image. Everything the CPU engine needs that the recipe
does not say is already in the launcher's line: the rehearsal runs the `cpu` engine stack
(recipes/stacks/cpu.yaml), so `plan` shows what runs here, argument for argument. This
replaces itself with the venv's real `vllm` entry point, unchanged argv and env, printing
nothing of its own: the container's init is vLLM itself, its log is vLLM's, and signals,
exit codes and `/dev/shm` use are the engine's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def engine_vllm() -> Path:
    """The `vllm` console script next to this interpreter (the engine venv's)."""
    return Path(sys.executable).parent / "vllm"


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print(
            "rehearsal CPU engine: only `vllm serve ...` runs here "
            f"(got: {' '.join(argv) or 'nothing'})",
            file=sys.stderr,
        )
        return 2
    exe = engine_vllm()
    if not exe.exists():
        print(f"rehearsal CPU engine: {exe} is missing; run make engine", file=sys.stderr)
        return 127
    os.execv(exe, [str(exe), *argv])
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
