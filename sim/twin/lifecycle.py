"""Process plumbing both ranks share: log format, exit, the one SIGTERM path, TileLang
marker, fault timing. It imports no other twin module except `faults`, so `serve` (boot)
and `app` (rank 0's server) can both depend on it without depending on each other."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from sim.twin.faults import Faults

log = logging.getLogger("twin")
MARKER = "spark-twin-tilelang.marker"


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            f"%(levelname)s %(asctime)s [spark-twin rank{rank}] %(message)s", "%m-%d %H:%M:%S"
        )
    )
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def die(why: str, code: int = 1) -> None:
    """Exit now (threads and sockets included), like a vLLM rank losing its peer."""
    log.error(why)
    for h in log.handlers:
        h.flush()
    sys.stdout.flush()
    os._exit(code)


def exit_on_sigterm() -> None:
    """Install the twin's only SIGTERM handler: log, then exit 0 (a clean stop).

    Installed once, before the boot phases, as vLLM's `run_server` does before it builds
    the engine (vllm/entrypoints/launchers/api_server/entry.py; the headless rank in
    vllm/entrypoints/cli/serve.py), so `docker rm -f`/`stop` is a clean stop in any phase.
    """
    signal.signal(signal.SIGTERM, lambda *_: die("received SIGTERM, shutting down", 0))


def tilelang_dir() -> Path:
    return Path(os.environ.get("TILELANG_CACHE_DIR") or Path.home() / ".tilelang" / "cache")


def write_marker() -> None:
    d = tilelang_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / MARKER).write_text(f"spark-twin kernels compiled {time.ctime()}\n")
    except OSError as exc:
        log.warning("cannot write TileLang cache marker in %s (%s): next boot is cold too", d, exc)


def fault_at(faults: Faults, phase: str) -> None:
    """Crash now, or after the given delay, if a fault asks for it at ``phase``."""
    delay = faults.crash_delay(phase)
    if delay is None:
        return
    why = f"RuntimeError: injected fault crash:{phase} (TWIN_FAULT={faults.spec!r})"
    if delay <= 0:
        die(why)
    threading.Timer(delay, die, args=(why,)).start()
