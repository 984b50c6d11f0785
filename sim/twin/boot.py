"""A vLLM 0.33 rank's boot, line by line: which process says what, in which order.

The order follows the code a real `vllm serve ... --nnodes 2` runs:
rank 0's API server parses args (vllm/entrypoints/launchers/launcher.py setup_server)
and starts the engine core (vllm/v1/engine/core.py), whose MultiprocExecutor spawns the
worker (vllm/v1/executor/multiproc_executor.py); the worker's init_device runs
torch.distributed init (vllm/distributed/parallel_state.py), which blocks until rank 1
is in; then it loads the model (vllm/v1/worker/gpu/model_runner.py, the V2 runner that
DSpark uses), compiles during the profiling run (vllm/compilation/), sizes the KV cache
(vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py) and captures CUDA graphs;
the engine core reports ready and the API server starts uvicorn. Rank 1 (`--headless`)
runs the same worker under a plain main process (vllm/entrypoints/cli/serve.py
run_headless). Durations come from the profile; sizes are the twin's (it runs no model).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from sim.twin import faults as faultmod
from sim.twin import profile as profmod
from sim.twin.cli import ServeArgs
from sim.twin.lifecycle import fault_at
from sim.twin.vllm_log import VLLM_VERSION, emit, uvicorn, worker_name

# Illustrative sizes for the messages (the twin holds no weights): one TP=2 shard of
# DeepSeek-V4-Flash-DSpark and the graph pool.
WEIGHTS_GIB_PER_RANK = 76.4
GRAPHS_GIB = 0.6
CAPTURE_SIZES = 35  # CUDA graph sizes vLLM captures for max-num-seqs 24 with gamma 5
ROUTES = (
    ("/health", "GET"),
    ("/v1/models", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/tokenize", "POST"),
)


def init_method(args: ServeArgs) -> str:
    """What the worker hands to init_process_group: the master's TCP store for two nodes."""
    if args.nnodes > 1:
        return f"tcp://{args.master_addr}:{args.master_port}"
    return f"file:///tmp/vllm_dist_{os.getpid():x}"


def head_preamble(
    args: ServeArgs,
    prof: profmod.Profile,
    non_default: dict[str, Any],
    bind: Callable[[], None] = lambda: None,
) -> None:
    """Rank 0 before its worker joins torch.distributed: API server, engine core, executor.

    ``bind`` takes the API port right after the non-default args line and before the engine
    is built, where vLLM's ``setup_server`` binds it (vllm/entrypoints/launchers/launcher.py:
    "bind the port before the engine is set up"); a taken port ends the boot there."""
    emit("APIServer", "non_default_args", non_default)
    bind()
    max_len = args.max_model_len or int(prof.section("scheduler").get("max_model_len", 0))
    emit(
        "EngineCore",
        "engine_init",
        VLLM_VERSION,
        f"model={args.model!r}, speculative_config={args.speculative_config}, "
        f"tensor_parallel_size={args.tensor_parallel_size}, "
        f"max_seq_len={max_len}, kv_cache_dtype={args.kv_cache_dtype}",
    )
    host_ip = os.environ.get("VLLM_HOST_IP") or args.master_addr
    local = max(args.tensor_parallel_size // max(args.nnodes, 1), 1)
    emit(
        "EngineCore",
        "dp_leader",
        0,
        0,
        args.master_addr,
        host_ip,
        args.tensor_parallel_size,
        local,
    )


def headless_preamble(args: ServeArgs) -> None:
    """Rank 1's main process: run_headless logs this, then starts the executor."""
    emit("MainProcess", "headless", VLLM_VERSION, f"{args.master_addr}:{args.master_port}")


def dist_init(args: ServeArgs, rank: int) -> None:
    """The worker's line right before it blocks in init_process_group."""
    emit("Worker", "dist_init", args.tensor_parallel_size, rank, 0, init_method(args), "nccl")


def rank_assigned(args: ServeArgs, rank: int) -> None:
    """Printed once init_process_group returned, i.e. every rank is in."""
    world = args.tensor_parallel_size
    emit("Worker", "rank_assigned", rank, world, 0, 0, 0, rank, rank, "N/A", "N/A")


def worker_phases(
    args: ServeArgs,
    prof: profmod.Profile,
    faults: faultmod.Faults,
    rank: int,
    warm: bool,
) -> float:
    """Load, compile, profile, capture, with the profile's durations; returns the total."""
    phases = prof.section("boot").get("warm" if warm else "cold") or {}

    def secs(field: str) -> float:
        return float(phases.get(field, 0.0)) * faults.slow_boot

    w = worker_name(rank, args.tensor_parallel_size)
    t0 = time.monotonic()
    fault_at(faults, "loading")
    emit(w, "load_start")
    load = secs("loading_weights_s")
    time.sleep(load)
    emit(w, "weights_took", load * 0.97)
    emit(w, "model_loading_took", f"{WEIGHTS_GIB_PER_RANK:.2f}", load)
    fault_at(faults, "compiling")
    compile_s = secs("compiling_s")
    emit(w, "compile_start", "")
    cache = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    emit(w, "compile_cache_dir", "", f"{cache}/torch_compile_cache/twin/rank_{rank}_0/backbone")
    time.sleep(compile_s)
    emit(w, "dynamo_time", "", compile_s * 0.3)
    if warm:
        emit(w, "compile_cached", "", "(1, 8192)", compile_s * 0.7)
    else:
        emit(w, "compile_graph", "", "(1, 8192)", compile_s * 0.7)
    emit(w, "compile_took", "", compile_s)
    emit(w, "profiling_took", "", 0.5)
    kv = prof.section("kv_cache")
    kv_tokens = int(kv.get("capacity_tokens", 1_200_000))
    emit(w, "kv_memory", f"{kv_tokens * 7.0 / (1 << 20):.2f}")
    if rank == 0:
        max_len = args.max_model_len or int(prof.section("scheduler").get("max_model_len", 1))
        emit("EngineCore", "kv_size", "GPU", f"{kv_tokens:,}", f"{max_len:,}", kv_tokens / max_len)
    fault_at(faults, "graphs")
    capture = secs("capturing_graphs_s")
    if rank == 0:  # only the global first rank draws the progress bar (cudagraph_utils.py)
        for _ in tqdm(range(CAPTURE_SIZES), desc="Capturing CUDA graphs (FULL)", file=sys.stderr):
            time.sleep(capture / CAPTURE_SIZES)
    else:
        time.sleep(capture)
    emit(w, "graphs_done", capture, GRAPHS_GIB)
    return time.monotonic() - t0


def engine_ready(elapsed: float, compile_s: float) -> None:
    emit("EngineCore", "engine_ready", elapsed, compile_s)


def api_server_up(args: ServeArgs) -> None:
    """The API server's lines, then uvicorn's three."""
    host = args.host or "0.0.0.0"
    host = f"[{host}]" if ":" in host else host
    emit("APIServer", "supported_tasks", ["generate"])
    emit("APIServer", "server_start", f"http://{host}:{args.port}")
    emit("APIServer", "routes")
    for path, methods in ROUTES:
        emit("APIServer", "route", path, methods)
    uvicorn("started", os.getpid())
    uvicorn("startup_wait")


def api_server_ready() -> None:
    uvicorn("startup_done")
