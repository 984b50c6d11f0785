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
SHUTDOWN_S = 1.5  # failed request -> process exit, measured 1.5 / 2.3 s
# with a stream open when the engine died, the exit came 4-6 s after the stream's error
# event (measured twice: kill -> error event 1.8 / 0.9 s, kill -> exit 7.7 / 5.0 s)
STREAM_SHUTDOWN_S = 5.0


def exit_delay(open_streams: int) -> float:
    return STREAM_SHUTDOWN_S if open_streams else SHUTDOWN_S


def gloo_message(peer: str, busy: bool) -> str:
    """gloo's exception text; ``peer`` is the socket's ``addr:port``. Idle when the peer
    died, the next collective finds the socket closed (pair.cc:553); with a step running,
    the read under way fails (pair.cc:537)."""
    addr, port = peer.rsplit(":", 1)
    if busy:
        what, why = vllm_log.GLOO_READ_ERROR
        head = f"pair.cc:537] {what}[{addr}]:{port}: Connection reset by peer. {why}"
    else:
        what, why = vllm_log.GLOO_PEER_CLOSED
        head = f"pair.cc:553] {what}[{addr}]:{port}. {why}"
    return (
        f"[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/{head}"
        "Check the logs of the remote worker before reporting an error. GLHF! \U0001f3d6"
    )


def stream_failed(chat: bool) -> None:
    """The API server's line for each stream that the dead engine ended."""
    key = "chat_stream_error" if chat else "completion_stream_error"
    emit("APIServer", key)
    emit_text("APIServer", key, TRACEBACK)
    emit_text(
        "APIServer", key, f"vllm.v1.engine.exceptions.EngineDeadError: {vllm_log.ENGINE_DEAD}"
    )


def step_failed(peer: str, busy: bool) -> None:
    """The lines of the failed step, in the order the three processes print them."""
    err = gloo_message(peer, busy)
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


def step_timed_out() -> None:
    """The lines of a step the other rank did not answer within
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (measured with rank 1 frozen by SIGSTOP:
    tests/data/real_engine/frozen_rank.json): collective_rpc's TimeoutError
    (vllm/v1/executor/multiproc_executor.py) kills the engine core, the API server's output
    handler raises EngineDeadError, and the server shuts down as after a lost peer."""
    emit("EngineCore", "engine_fatal")
    emit_text("EngineCore", "engine_fatal", TRACEBACK)
    emit_text("EngineCore", "engine_fatal", "TimeoutError")
    emit_text("EngineCore", "engine_fatal", "")
    emit_text(
        "EngineCore",
        "engine_fatal",
        "The above exception was the direct cause of the following exception:",
    )
    emit_text("EngineCore", "engine_fatal", "")
    emit_text("EngineCore", "engine_fatal", TRACEBACK)
    emit_text("EngineCore", "engine_fatal", "TimeoutError: RPC call to execute_model timed out.")
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
