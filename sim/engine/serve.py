"""`vllm serve` for the rehearsal's real-engine image: apply the rehearsal layer, exec real vLLM.

The rehearsal runtime's `vllm` (sim/rehearsal/bin/vllm) runs this in the engine venv when
the pair's image is the CPU-engine image. It prints one "rehearsal layer: ..." line per
change (they land in the rank's container log, so `dspark_launch.sh logs` shows them),
then replaces itself with the venv's real `vllm` entry point, so the container's init is
vLLM itself: signals, exit codes and `/dev/shm` use are the engine's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sim.engine import layer


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
    new_argv, env, changes = layer.apply(layer.load(), argv, os.environ)
    for change in changes:
        print(change.line(), flush=True)
    exe = engine_vllm()
    if not exe.exists():
        print(f"rehearsal CPU engine: {exe} is missing; run make engine", file=sys.stderr)
        return 127
    os.execve(exe, [str(exe), *new_argv], env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
