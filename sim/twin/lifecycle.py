"""Process plumbing both ranks share: logging, exit, the one SIGTERM path, TileLang
marker, fault timing. It imports no other twin module except `faults` and `vllm_log`, so
`serve` (boot) and `app` (rank 0's server) can both depend on it without depending on
each other."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sim.twin import vllm_log
from sim.twin.faults import Faults

log = logging.getLogger("twin")
MARKER = "spark-twin-tilelang.marker"


class Role:
    """Which vLLM process tree this twin stands for, and how far it got (for SIGTERM)."""

    headless = False  # rank 1 (--headless): vllm/entrypoints/cli/serve.py run_headless
    serving = False  # rank 0 after uvicorn's "Application startup complete."
    # rank 0 serving: what to call when the TP peer's socket closes (the engine's lose_peer)
    on_peer_lost: Callable[[str], None] | None = None
    joined = False  # the ranks found each other (the workers exist)
    stopping = False  # a SIGTERM is being handled


ROLE = Role()


def setup_logging() -> None:
    vllm_log.setup()


def die(why: str | None, code: int = 1) -> None:
    """Exit now (threads and sockets included), like a vLLM rank losing its peer.

    ``why`` is logged as the twin's own line; None when the real lines are already out.
    """
    if why is not None:
        log.error(why)
    _exit(code)


def _exit(code: int) -> None:
    vllm_log.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _on_sigterm(*_: object) -> None:
    """What vLLM 0.33 prints and does on SIGTERM (`docker stop`), by role and phase.

    - headless rank 1: run_headless's handler raises SystemExit (vllm/entrypoints/cli/
      serve.py); the MultiprocExecutor then stops its worker (multiproc_executor.py
      `_ensure_worker_termination`) and the process exits 0. Once joined, the worker
      ignores it and is escalated (SIGTERM, SIGKILL): ~14 s, measured (below).
    - rank 0 serving: serve_http's handler (vllm/entrypoints/launchers/launcher.py) stops
      the engine client (shutdown_timeout 0 = abort), then uvicorn shuts down; exit 0.
    - rank 0 booting: run_server's `_interrupt_init` (vllm/entrypoints/launchers/
      api_server/entry.py) raises KeyboardInterrupt("terminated"), which nothing catches:
      Python prints the traceback, whose last line is below, and ends by SIGINT (docker
      reports exit code 130).
    """
    if ROLE.stopping:
        return
    ROLE.stopping = True
    if ROLE.headless and ROLE.joined:
        _headless_worker_escalation()
    if ROLE.headless:
        vllm_log.emit("MainProcess", "executor_wait_exit", 1)
        vllm_log.emit("MainProcess", "executor_exited")
        _exit(0)
    if ROLE.serving:
        vllm_log.emit("APIServer", "shutdown_triggered")
        vllm_log.emit("APIServer", "shutdown_engine", "abort", 0)
        vllm_log.emit("APIServer", "shutdown_engine_stopped")
        vllm_log.emit("APIServer", "shutdown_http")
        vllm_log.emit("APIServer", "shutdown_fastapi")
        vllm_log.uvicorn("shutting_down")
        vllm_log.uvicorn("shutdown_wait")
        vllm_log.uvicorn("shutdown_done")
        _exit(0)
    print("KeyboardInterrupt: terminated", file=sys.stderr, flush=True)
    vllm_log.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


# Measured on vLLM 0.32 (a loopback TP=2 pair, docs/simulator.md "Peer loss and shutdown"):
# SIGTERM to a joined headless rank 1 ends it 12-14 s later (two runs: 14.3, <= 12.0 s),
# exit 0. Its worker ignores the parent's exit, so the executor escalates (vllm/v1/executor/
# multiproc_executor.py `_ensure_worker_termination`): VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
# (5) of grace, SIGTERM, 4 s, SIGKILL. The first line came 2-4 s after the signal, the exit
# ~0.8 s after the last.
HEADLESS_NOTICE_S = 3.0
HEADLESS_SIGTERM_WAIT_S = 4.0
HEADLESS_EXIT_S = 0.8


def _headless_worker_escalation() -> None:
    """Rank 1's SIGTERM once its worker exists: the executor's escalation, then exit 0."""
    try:
        grace = float(os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5"))
    except ValueError:
        grace = 5.0
    time.sleep(HEADLESS_NOTICE_S)
    vllm_log.emit("Worker_TP1", "parent_exited")
    vllm_log.emit("MainProcess", "executor_wait_exit", 1)
    time.sleep(grace)
    vllm_log.emit("MainProcess", "executor_sigterm_workers", 1)
    time.sleep(HEADLESS_SIGTERM_WAIT_S)
    vllm_log.emit("MainProcess", "executor_sigkill_workers", 1)
    time.sleep(HEADLESS_EXIT_S)
    _exit(0)


def exit_on_sigterm() -> None:
    """Install the twin's only SIGTERM handler, before the boot phases, as vLLM's
    `run_server` (and `run_headless`) do, so `docker stop` behaves as vLLM's in any phase."""
    signal.signal(signal.SIGTERM, _on_sigterm)


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
