"""Where this machine's CPU engine is, and the tiny model it serves (built on first use).

The engine lives in its own venv (`REPO/.venv-engine`, scripts/install_cpu_engine.sh);
the rehearsal and the tests run from the main venv, so they reach the engine's Python
through here rather than importing vLLM 0.32 themselves.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pairctl.home import project_root

REPO = project_root()
ENGINE_VENV = REPO / ".venv-engine"


class EngineMissing(RuntimeError):
    """The engine venv is absent or broken; the message says how to fix it."""


def engine_python() -> Path:
    return ENGINE_VENV / "bin" / "python"


def installed() -> bool:
    return (ENGINE_VENV / "bin" / "vllm").exists()


def check() -> None:
    """Raise EngineMissing unless the engine venv passes `python -m sim.engine.check`."""
    py = engine_python()
    if not py.exists():
        raise EngineMissing(f"the CPU engine is not installed ({py}); run `make engine`")
    # From /, as a container runs it: the engine venv must find this repo by its own
    # (editable) install, not through the current directory.
    res = subprocess.run(
        [str(py), "-m", "sim.engine.check"], capture_output=True, text=True, cwd="/"
    )
    if res.returncode != 0:
        raise EngineMissing((res.stderr.strip() or "engine check failed") + "; run `make engine`")


def built_model() -> Path:
    """The tiny model's directory, built by the engine's Python on first use (cached)."""
    check()
    res = subprocess.run(
        [str(engine_python()), "-m", "sim.engine.tiny_model"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    if res.returncode != 0:
        raise EngineMissing(f"tiny model build failed: {res.stderr.strip()[-500:]}")
    return Path(res.stdout.strip().splitlines()[-1])
