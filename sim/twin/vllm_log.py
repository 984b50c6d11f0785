"""vLLM 0.33's own log lines, in vLLM's own format, for the twin to print.

A real pair's boot is read from these lines (pairctl.lifecycle.steps matches them), so the twin
prints the messages vLLM 0.33 prints, with the same wording, in the same order, from the
same processes. Every entry of ``LINES`` names the installed source file and the line of
the logger call; tests/test_twin_log.py checks each one against the installed vLLM.

Format: vLLM's ``_FORMAT`` in vllm/logger.py,
``(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]``,
date ``%m-%d %H:%M:%S``. The process names are the ones vLLM sets: ``APIServer``
(vllm/entrypoints/launchers/api_server/entry.py, ``decorate_logs("APIServer")``),
``EngineCore`` (vllm/v1/engine/utils.py names the process ``EngineCore`` unless data
parallel, then ``EngineCore_DP<N>``), ``Worker`` until the parallel groups exist, then
``Worker_TP<rank>`` (vllm/v1/executor/multiproc_executor.py,
``setup_proc_title_and_log_prefix``), and ``MainProcess`` for the headless rank's main
process, which no vLLM code renames. The twin is one process per rank, so every name
carries the twin's one pid.

uvicorn's lines ("Application startup complete.") use uvicorn's default log config
(uvicorn/config.py ``LOGGING_CONFIG``: ``%(levelprefix)s %(message)s`` on stderr), because
vLLM passes no log config of its own unless asked (vllm/entrypoints/launchers/utils/
server_utils.py ``get_uvicorn_log_config`` returns None).

Lines about the twin itself (its label, fault switches) are the twin's own: they carry the
process name ``SparkTwin`` and no vLLM file, so nobody mistakes them for vLLM's.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

TWIN_PROCESS = "SparkTwin"
VLLM_VERSION = "0.33.0"


@dataclass(frozen=True)
class Line:
    """One logger call in an installed package: where it is, its level and format string."""

    source: str  # path under site-packages
    lineno: int  # the logger call's line (what vLLM prints after the file name)
    level: str
    template: str  # the message format string, exactly as in the source

    @property
    def fileinfo(self) -> str:
        """What vLLM prints in brackets: the file's base name and the line."""
        return f"{self.source.rsplit('/', 1)[-1]}:{self.lineno}"


# Keyed by a short name; the twin prints them through ``emit``.
LINES: dict[str, Line] = {
    "non_default_args": Line(
        "vllm/entrypoints/common/startup.py", 96, "INFO", "non-default args: %s"
    ),
    "engine_init": Line(
        "vllm/v1/engine/core.py",
        139,
        "INFO",
        "Initializing a V1 LLM engine (v%s) with config: %s",
    ),
    "dp_leader": Line(
        "vllm/v1/executor/multiproc_executor.py",
        167,
        "INFO",
        "DP group leader: node_rank=%d, node_rank_within_dp=%d, master_addr=%s, "
        "mq_connect_ip=%s (local), world_size=%d, local_world_size=%d",
    ),
    "headless": Line(
        "vllm/entrypoints/cli/serve.py",
        224,
        "INFO",
        "Launching vLLM (v%s) headless multiproc executor, with head node address %s "
        "for torch.distributed process group.",
    ),
    "dist_init": Line(
        "vllm/distributed/parallel_state.py",
        1929,
        "INFO",
        "world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",
    ),
    "rank_assigned": Line(
        "vllm/distributed/parallel_state.py",
        2385,
        "INFO",
        "rank %s in world size %s is assigned as DP rank %s, PP rank %s, PCP rank %s, "
        "TP rank %s, ETP rank %s, EP rank %s, EPLB rank %s",
    ),
    "load_start": Line(
        "vllm/v1/worker/gpu/model_runner.py", 399, "INFO", "Loading model from scratch..."
    ),
    "weights_took": Line(
        "vllm/model_executor/model_loader/default_loader.py",
        506,
        "INFO",
        "Loading weights took %.2f seconds",
    ),
    "model_loading_took": Line(
        "vllm/v1/worker/gpu/model_runner.py",
        428,
        "INFO",
        "Model loading took %s GiB memory and %.6f seconds",
    ),
    "compile_start": Line("vllm/compilation/monitor.py", 40, "INFO", "%sStarting torch.compile"),
    "compile_cache_dir": Line(
        "vllm/compilation/backends.py",
        1125,
        "INFO",
        "%sUsing cache directory: %s for vLLM's torch.compile",
    ),
    "dynamo_time": Line(
        "vllm/compilation/backends.py", 1187, "INFO", "%sDynamo bytecode transform time: %.2f s"
    ),
    "compile_graph": Line(
        "vllm/compilation/backends.py",
        417,
        "INFO",
        "%sCompiling a graph for compile range %s takes %.2f s",
    ),
    "compile_cached": Line(
        "vllm/compilation/backends.py",
        310,
        "INFO",
        "%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
    ),
    # The format string is monitor_torch_compile's default `message` argument (line 20);
    # the logger call that prints it is on line 62.
    "compile_took": Line(
        "vllm/compilation/monitor.py", 62, "INFO", "%storch.compile took %.2f s in total"
    ),
    "profiling_took": Line(
        "vllm/compilation/monitor.py", 91, "INFO", "%sInitial profiling/warmup run took %.2f s"
    ),
    "kv_memory": Line(
        "vllm/v1/worker/gpu_worker.py", 772, "INFO", "Available KV cache memory: %s GiB"
    ),
    "kv_size": Line(
        "vllm/v1/core/kv_cache_utils.py",
        1147,
        "INFO",
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
    ),
    "graphs_done": Line(
        "vllm/v1/worker/gpu/model_runner.py",
        1163,
        "INFO",
        "Graph capturing finished in %.0f secs, took %.2f GiB",
    ),
    "engine_ready": Line(
        "vllm/v1/engine/core.py",
        405,
        "INFO",
        "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
    ),
    "supported_tasks": Line(
        "vllm/entrypoints/launchers/api_server/entry.py", 135, "INFO", "Supported tasks: %s"
    ),
    "server_start": Line(
        "vllm/entrypoints/launchers/api_server/entry.py", 139, "INFO", "Starting vLLM server on %s"
    ),
    "routes": Line("vllm/entrypoints/launchers/launcher.py", 188, "INFO", "Available routes are:"),
    "route": Line("vllm/entrypoints/launchers/launcher.py", 197, "INFO", "Route: %s, Methods: %s"),
    "shutdown_triggered": Line(
        "vllm/entrypoints/launchers/launcher.py",
        256,
        "INFO",
        "[shutdown] API server: shutdown triggered",
    ),
    "shutdown_engine": Line(
        "vllm/entrypoints/launchers/launcher.py",
        272,
        "INFO",
        "[shutdown] API server: stopping engine client mode=%s timeout=%ss",
    ),
    "shutdown_engine_stopped": Line(
        "vllm/entrypoints/launchers/launcher.py",
        281,
        "INFO",
        "[shutdown] API server: engine client stopped",
    ),
    "shutdown_http": Line(
        "vllm/entrypoints/launchers/launcher.py",
        284,
        "INFO",
        "[shutdown] API server: signalling HTTP server shutdown",
    ),
    "shutdown_fastapi": Line(
        "vllm/entrypoints/launchers/launcher.py",
        306,
        "INFO",
        "[shutdown] API server: shutting down FastAPI HTTP server",
    ),
    "executor_wait_exit": Line(
        "vllm/v1/executor/multiproc_executor.py",
        580,
        "INFO",
        "[shutdown] Executor: waiting for worker exit count=%d",
    ),
    "executor_exited": Line(
        "vllm/v1/executor/multiproc_executor.py",
        587,
        "INFO",
        "[shutdown] Executor: all workers exited gracefully",
    ),
    "executor_sigterm_workers": Line(
        "vllm/v1/executor/multiproc_executor.py",
        592,
        "WARNING",
        "[shutdown] Executor: workers still running after grace period; sending SIGTERM count=%d",
    ),
    "executor_sigkill_workers": Line(
        "vllm/v1/executor/multiproc_executor.py",
        602,
        "WARNING",
        "[shutdown] Executor: workers still running after SIGTERM; sending SIGKILL count=%d",
    ),
    "engine_fatal": Line(
        "vllm/v1/engine/core.py", 1586, "ERROR", "EngineCore encountered a fatal error."
    ),
    # A TP peer lost while serving (measured on vLLM 0.32 CPU; file/line from 0.33):
    # the worker's collective fails, the engine core dies, the API server shuts down.
    "worker_exception": Line(
        "vllm/v1/executor/multiproc_executor.py", 1189, "ERROR", "WorkerProc hit an exception."
    ),
    "output_handler_failed": Line(
        "vllm/v1/engine/async_llm.py", 943, "ERROR", "AsyncLLM output_handler failed."
    ),
    "chat_stream_error": Line(
        "vllm/entrypoints/openai/chat_completion/serving.py",
        952,
        "ERROR",
        "Error in chat completion stream generator.",
    ),
    "completion_stream_error": Line(
        "vllm/entrypoints/openai/completion/serving.py",
        555,
        "ERROR",
        "Error in completion stream generator.",
    ),
    "parent_exited": Line(
        "vllm/v1/executor/multiproc_executor.py",
        944,
        "INFO",
        "Parent process exited, terminating worker queues",
    ),
    "mpclient_start": Line(
        "vllm/v1/engine/core_client.py", 792, "INFO", "[shutdown] MPClient: start timeout=%s"
    ),
    "mpclient_stopping": Line(
        "vllm/v1/engine/core_client.py", 794, "INFO", "[shutdown] MPClient: stopping engine manager"
    ),
    "mpclient_stopped": Line(
        "vllm/v1/engine/core_client.py", 796, "INFO", "[shutdown] MPClient: engine manager stopped"
    ),
    "mpclient_cleanup": Line(
        "vllm/v1/engine/core_client.py",
        797,
        "INFO",
        "[shutdown] MPClient: cleaning up background resources",
    ),
    "mpclient_complete": Line(
        "vllm/v1/engine/core_client.py", 799, "INFO", "[shutdown] MPClient: complete"
    ),
    "procman_sigterm": Line(
        "vllm/v1/utils.py", 628, "INFO", "[shutdown] Process manager: send sigterm to process %s"
    ),
    "procman_force_count": Line(
        "vllm/v1/utils.py",
        648,
        "WARNING",
        "[shutdown] Process manager: force killing remaining processes count=%d",
    ),
    "procman_force_one": Line(
        "vllm/v1/utils.py",
        653,
        "WARNING",
        "[shutdown] Process manager: force killing remaining process %s pid %d",
    ),
    "force_kill_child": Line(
        "vllm/utils/system_utils.py",
        248,
        "WARNING",
        "[shutdown] force killing sub process %s pid %d",
    ),
    "worker_failed_start": Line(
        "vllm/v1/executor/multiproc_executor.py", 1057, "ERROR", "WorkerProc failed to start."
    ),
}

# uvicorn's own lines (uvicorn 0.54: server.py and lifespan/on.py), printed unprefixed.
UVICORN: dict[str, Line] = {
    "started": Line("uvicorn/server.py", 103, "INFO", "Started server process [%d]"),
    "startup_wait": Line("uvicorn/lifespan/on.py", 48, "INFO", "Waiting for application startup."),
    "startup_done": Line("uvicorn/lifespan/on.py", 62, "INFO", "Application startup complete."),
    "shutting_down": Line("uvicorn/server.py", 282, "INFO", "Shutting down"),
    "shutdown_wait": Line(
        "uvicorn/lifespan/on.py", 67, "INFO", "Waiting for application shutdown."
    ),
    "shutdown_done": Line("uvicorn/lifespan/on.py", 76, "INFO", "Application shutdown complete."),
    "finished": Line("uvicorn/server.py", 113, "INFO", "Finished server process [%d]"),
}

# Messages of torch's c10d TCPStore (C++, torch/csrc/distributed/c10d/TCPStore.cpp); they
# reach the log as the text of the exception that ends a worker. tests/test_twin_log.py
# finds each format in the installed libtorch_cpu.so.
TORCH_STORE = {
    "server_timeout": "Timed out after {} seconds waiting for clients. {}/{} clients joined.",
    "client_timeout": "The client socket has timed out after {} while trying to connect to "
    "({}, {}).",
    "server_listen": "The server socket has failed to listen on any local network address. "
    "port: {}, useIpv6: {}, code: {}, name: {}, message: {}",
}

# gloo's words when the TP peer's socket closes under a collective (third_party/gloo
# transport/tcp/pair.cc, compiled into libtorch_cpu.so; tests/test_twin_log.py finds them).
GLOO_PEER_CLOSED = (
    "Connection closed by peer ",
    "This is typically caused by a remote worker crashing. ",
)
# ... and when it resets under a collective already running (a step in flight)
GLOO_READ_ERROR = (
    "Read error ",
    "This is typically caused by a remote worker hanging or bugs in the application. ",
)
# vllm/v1/engine/exceptions.py EngineDeadError's message: what a request gets (HTTP 500)
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."

_log = logging.getLogger("twin")
_uvicorn = logging.getLogger("twin.uvicorn")


class _VllmFormatter(logging.Formatter):
    """vLLM's line shape; records without vLLM metadata are the twin's own."""

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "vproc"):
            record.vproc = TWIN_PROCESS
            record.vfile = "spark-twin"
        return super().format(record)


class _UvicornFormatter(logging.Formatter):
    """uvicorn's default ``%(levelprefix)s %(message)s`` (uvicorn/logging.py)."""

    def format(self, record: logging.LogRecord) -> str:
        record.levelprefix = record.levelname + ":" + " " * (8 - len(record.levelname))
        return super().format(record)


def setup() -> None:
    """vLLM's logger on stdout (its default stream), uvicorn's on stderr."""
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(
        _VllmFormatter(
            "(%(vproc)s pid=%(process)d) %(levelname)s %(asctime)s [%(vfile)s] %(message)s",
            "%m-%d %H:%M:%S",
        )
    )
    _log.handlers[:] = [out]
    _log.setLevel(logging.INFO)
    _log.propagate = False
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(_UvicornFormatter("%(levelprefix)s %(message)s"))
    _uvicorn.handlers[:] = [err]
    _uvicorn.setLevel(logging.INFO)
    _uvicorn.propagate = False


def emit(process: str, key: str, *args: object) -> None:
    """Print vLLM's line ``key`` as process ``process`` would."""
    line = LINES[key]
    _log.log(
        logging.getLevelName(line.level),
        line.template,
        *args,
        extra={"vproc": process, "vfile": line.fileinfo},
    )


def emit_text(process: str, key: str, text: str) -> None:
    """One more line of line ``key``'s record (a traceback line under logger.exception)."""
    line = LINES[key]
    _log.log(
        logging.getLevelName(line.level),
        "%s",
        text,
        extra={"vproc": process, "vfile": line.fileinfo},
    )


def uvicorn(key: str, *args: object) -> None:
    """Print uvicorn's line ``key``."""
    line = UVICORN[key]
    _uvicorn.log(logging.getLevelName(line.level), line.template, *args)


def worker_name(tp_rank: int | None, tp_size: int = 2) -> str:
    """``Worker`` before the parallel groups exist, ``Worker_TP<rank>`` after, and only with
    TP > 1 (multiproc_executor.py ``setup_proc_title_and_log_prefix`` adds ``_TP<rank>``
    only when the TP group has more than one rank)."""
    return "Worker" if tp_rank is None or tp_size <= 1 else f"Worker_TP{tp_rank}"


def flush() -> None:
    for h in _log.handlers + _uvicorn.handlers:
        h.flush()
