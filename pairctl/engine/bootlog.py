"""Where a booting rank is, read from its container log: needles vLLM 0.33 really prints.

Every needle is a substring of a message in the installed vLLM 0.33 (or uvicorn) source
file named beside it; tests/test_bootlog.py greps the installed packages for each one, so
a needle that real vLLM never prints cannot come back. The order of ``NEEDLES`` is the
boot order of one rank (docs/FIDELITY.md lists them with their files).

Rank 1 joining is visible on the head itself: its worker logs ``world_size=2 rank=0 ...
distributed_init_method=tcp://MASTER:PORT`` (vllm/distributed/parallel_state.py) and then
blocks in ``torch.distributed.init_process_group`` until every rank has reached the TCP
store on MASTER_PORT; the next line, ``rank 0 in world size 2 is assigned as ...``, only
comes once rank 1 is in. A head stuck between the two is waiting for rank 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pairctl.engine.stack import Stack

RENDEZVOUS = "rendezvous"


@dataclass(frozen=True)
class Needle:
    """A substring of a real log message, the phase it starts, and its source file."""

    text: str
    phase: str
    source: str  # path under site-packages of the message's file


NEEDLES: tuple[Needle, ...] = (
    Needle(
        "headless multiproc executor",
        "starting (headless)",
        "vllm/entrypoints/cli/serve.py",
    ),
    Needle("non-default args:", "starting", "vllm/entrypoints/common/startup.py"),
    Needle("Initializing a V1 LLM engine", "starting engine", "vllm/v1/engine/core.py"),
    Needle("DP group leader:", "starting workers", "vllm/v1/executor/multiproc_executor.py"),
    Needle("distributed_init_method=", RENDEZVOUS, "vllm/distributed/parallel_state.py"),
    Needle("is assigned as DP rank", "ranks joined", "vllm/distributed/parallel_state.py"),
    Needle("Loading model from scratch", "loading weights", "vllm/v1/worker/gpu/model_runner.py"),
    Needle("Starting to load model", "loading weights", "vllm/v1/worker/gpu_model_runner.py"),
    Needle(
        "Loading safetensors checkpoint shards",
        "loading weights",
        "vllm/model_executor/model_loader/weight_utils.py",
    ),
    Needle(
        "Loading weights took",
        "loading weights",
        "vllm/model_executor/model_loader/default_loader.py",
    ),
    Needle("Starting torch.compile", "compiling", "vllm/compilation/monitor.py"),
    Needle("Dynamo bytecode transform time", "compiling", "vllm/compilation/backends.py"),
    Needle("Compiling a graph for compile range", "compiling", "vllm/compilation/backends.py"),
    Needle("Directly load the compiled graph", "compiling", "vllm/compilation/backends.py"),
    Needle("torch.compile took", "compiling", "vllm/compilation/monitor.py"),
    Needle("Initial profiling/warmup run took", "profiling memory", "vllm/compilation/monitor.py"),
    Needle("Available KV cache memory", "profiling memory", "vllm/v1/worker/gpu_worker.py"),
    Needle(
        "Capturing CUDA graphs", "capturing CUDA graphs", "vllm/v1/worker/gpu/cudagraph_utils.py"
    ),
    Needle("Graph capturing finished", "graphs captured", "vllm/v1/worker/gpu/model_runner.py"),
    Needle(
        "init engine (profile, create kv cache, warmup model) took",
        "engine ready",
        "vllm/v1/engine/core.py",
    ),
    Needle(
        "Starting vLLM server on",
        "starting API server",
        "vllm/entrypoints/launchers/api_server/entry.py",
    ),
    Needle("Application startup complete.", "API server up", "uvicorn/lifespan/on.py"),
)


# Boot order of the phases (``phase_of``'s default "starting" first; rank 1's headless main
# process logs "starting (headless)" instead of the API server's "starting"). A rank's
# phase only moves forward in this order: pairctl.engine.bootwatch ignores a tail whose last
# needle scrolled out of the window.
PHASES: tuple[str, ...] = (
    "starting",
    "starting (headless)",
    "starting engine",
    "starting workers",
    RENDEZVOUS,
    "ranks joined",
    "loading weights",
    "compiling",
    "profiling memory",
    "capturing CUDA graphs",
    "graphs captured",
    "engine ready",
    "starting API server",
    "API server up",
)


def needles_for(stack: Stack) -> tuple[Needle, ...]:
    """The needles for a stack's vLLM: its ``boot_markers`` replace the list above
    (``boot_markers_replace``) or are added to it, a marker with a needle's text replacing
    that needle (the same message, printed from another file or meaning another phase)."""
    own = tuple(Needle(m.text, m.phase, m.source) for m in stack.boot_markers)
    if stack.boot_markers_replace:
        return own
    texts = {n.text for n in own}
    return tuple(n for n in NEEDLES if n.text not in texts) + own


def phase_of(text: str, needles: Sequence[Needle] = NEEDLES) -> str:
    """The phase of the last log line that carries a needle; 'starting' if none yet."""
    phase = "starting"
    for line in text.splitlines():
        for needle in needles:
            if needle.text in line:
                phase = needle.phase
    return phase


def shown(phase: str, rank: int, nnodes: int = 2) -> str:
    """The phase as the progress line shows it for ``rank`` of a group of ``nnodes``."""
    if phase == RENDEZVOUS:
        if rank != 0:
            return "joining rank 0"
        return "waiting for rank 1 to join" if nnodes == 2 else "waiting for ranks 1-3 to join"
    return phase
