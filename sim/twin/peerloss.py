"""Rank 0 after its TP peer is gone, as real vLLM behaves (measured on vLLM 0.32, CPU build,
a loopback TP=2 pair; the table is in docs/simulator.md, "Peer loss and shutdown").

Nothing happens when the peer dies: the head's worker only notices at its next collective.
`/health` stays 200 for as long as no request comes. The next engine step fails: the
worker's all-reduce raises gloo's "Connection closed by peer", the engine core dies
(`EngineCore encountered a fatal error.`), the API server's output handler raises
`EngineDeadError`, every request in flight gets HTTP 500 with that error's message, and the
API server shuts down on its own: `/health` 503, the socket closes, and the process exits 0
about 1.5 s after the failed request (vllm/entrypoints/launchers/launcher.py: the engine
dead, uvicorn is told to exit; run_server then returns normally).
"""

from __future__ import annotations

import os

from sim.twin import vllm_log
from sim.twin.vllm_log import emit, emit_text, uvicorn

TRACEBACK = "Traceback (most recent call last):"
SHUTDOWN_S = 1.5  # failed request -> process exit, measured (1.53 s)


def gloo_message(peer: str) -> str:
    """gloo's exception text; ``peer`` is the closed socket's ``addr:port``."""
    closed, crashing = vllm_log.GLOO_PEER_CLOSED
    return (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        f"{closed}[{peer.rsplit(':', 1)[0]}]:{peer.rsplit(':', 1)[-1]}. {crashing}"
        "Check the logs of the remote worker before reporting an error. GLHF! \U0001f3d6"
    )


def step_failed(peer: str) -> None:
    """The lines of the failed step, in the order the three processes print them."""
    err = gloo_message(peer)
    emit("Worker_TP0", "worker_exception")
    emit_text("Worker_TP0", "worker_exception", TRACEBACK)
    emit_text("Worker_TP0", "worker_exception", f"RuntimeError: {err}")
    emit("EngineCore", "engine_fatal")
    emit_text("EngineCore", "engine_fatal", TRACEBACK)
    emit_text(
        "EngineCore",
        "engine_fatal",
        f"RuntimeError: Worker failed with error '{err}', please check the stack trace "
        "above for the root cause",
    )
    emit("APIServer", "output_handler_failed")
    emit_text("APIServer", "output_handler_failed", TRACEBACK)
    emit_text(
        "APIServer",
        "output_handler_failed",
        f"vllm.v1.engine.exceptions.EngineDeadError: {vllm_log.ENGINE_DEAD}",
    )
    emit("EngineCore", "executor_wait_exit", 1)
    emit("Worker_TP0", "parent_exited")


def http_down() -> None:
    """uvicorn stops serving (the API server saw the engine die)."""
    uvicorn("shutting_down")
    uvicorn("shutdown_wait")
    uvicorn("shutdown_done")
    uvicorn("finished", os.getpid())


def engine_client_down() -> None:
    """The engine client's cleanup after uvicorn returned, then the process exits 0."""
    pid = os.getpid()
    emit("APIServer", "mpclient_start", "0s")
    emit("APIServer", "mpclient_stopping")
    emit("APIServer", "procman_sigterm", "EngineCore")
    emit("APIServer", "procman_force_count", 1)
    emit("APIServer", "procman_force_one", "EngineCore", pid)
    emit("APIServer", "force_kill_child", "VLLM::Worker_TP0", pid)
    emit("APIServer", "mpclient_stopped")
    emit("APIServer", "mpclient_cleanup")
    emit("APIServer", "mpclient_complete")
