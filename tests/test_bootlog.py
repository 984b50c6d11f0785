"""The launcher reads boot phases with needles real vLLM 0.33 (or uvicorn) prints.

Each needle is found in the installed source file it names (needs_vllm); the phases follow
a boot as vLLM logs it; the "rank 1 has not joined" hint is keyed on the head's worker
sitting in torch.distributed init; and no needle the real vLLM never prints is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pairctl.engine.bootlog import NEEDLES, RENDEZVOUS, phase_of, shown
from tests.support.vllm_src import site_packages, string_constants

REPO = Path(__file__).resolve().parents[1]
INVENTED = ("Waiting for rank 1 to join", "Starting vLLM API server", "Worker ready")


@pytest.mark.needs_vllm
@pytest.mark.parametrize("needle", NEEDLES, ids=lambda n: n.text)
def test_each_needle_is_in_the_installed_source_it_names(needle) -> None:
    path = site_packages() / needle.source
    assert path.is_file(), f"{needle.source} is not in the installed vLLM/uvicorn"
    hits = [s for s in string_constants(path) if needle.text in s]
    assert hits, f"{needle.text!r} is in no string of {needle.source}"


def test_no_invented_needle_is_left_anywhere() -> None:
    for needle in NEEDLES:
        assert not any(bad in needle.text for bad in INVENTED)
    code = [*REPO.glob("pairctl/**/*.py"), *REPO.glob("sim/**/*.py"), REPO / "launch/README.md"]
    code += [REPO / "docs/INTERFACES.md", REPO / "docs/simulator.md", REPO / "README.md"]
    for path in code:
        text = path.read_text()
        for bad in INVENTED:
            assert bad not in text, f"{path.relative_to(REPO)} still says {bad!r}"


# A head's log as vLLM 0.33 prints it (format of vllm/logger.py; lines of a two-node boot).
HEAD = """\
(APIServer pid=1) INFO 11-30 10:00:01 [startup.py:96] non-default args: {'model_tag': '/m'}
(EngineCore pid=90) INFO 11-30 10:00:09 [core.py:139] Initializing a V1 LLM engine (v0.33.0)
(EngineCore pid=90) INFO 11-30 10:00:09 [multiproc_executor.py:167] DP group leader: node_rank=0
(Worker pid=120) INFO 11-30 10:00:20 [parallel_state.py:1929] world_size=2 rank=0 local_rank=0 \
distributed_init_method=tcp://10.0.0.1:29501 backend=nccl
"""
JOINED = """\
(Worker pid=120) INFO 11-30 10:01:30 [parallel_state.py:2385] rank 0 in world size 2 is \
assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_TP0 pid=120) INFO 11-30 10:01:31 [model_runner.py:399] Loading model from scratch...
"""
W = "(Worker_TP0 pid=120) INFO 11-30 10:03:00 "
E = "(EngineCore pid=90) INFO 11-30 10:09:00 "
LATER = [
    (W + "[default_loader.py:506] Loading weights took 93.10 seconds", "loading weights"),
    (W + "[monitor.py:40] Starting torch.compile", "compiling"),
    (W + "[monitor.py:62] torch.compile took 201.31 s in total", "compiling"),
    (W + "[gpu_worker.py:772] Available KV cache memory: 7.90 GiB", "profiling memory"),
    ("Capturing CUDA graphs (FULL):  40%|████      | 14/35 [00:09<00:14]", "capturing CUDA graphs"),
    (
        W + "[model_runner.py:1163] Graph capturing finished in 24 secs, took 0.60 GiB",
        "graphs captured",
    ),
    (
        E + "[core.py:405] init engine (profile, create kv cache, warmup model) took 512.20 s",
        "engine ready",
    ),
    (
        "(APIServer pid=1) INFO [entry.py:139] Starting vLLM server on http://0.0.0.0:8000",
        "starting API server",
    ),
    ("INFO:     Application startup complete.", "API server up"),
]


def test_phases_follow_a_real_boot() -> None:
    assert phase_of("") == "starting"
    assert phase_of(HEAD) == RENDEZVOUS
    assert shown(RENDEZVOUS, 0) == "waiting for rank 1 to join"
    assert shown(RENDEZVOUS, 1) == "joining rank 0"
    text = HEAD + JOINED
    assert phase_of(text) == "loading weights"
    for line, phase in LATER:
        text += line + "\n"
        assert phase_of(text) == phase, line
    # rank 1's headless main process before its worker starts
    assert phase_of(
        "(MainProcess pid=1) INFO [serve.py:224] Launching vLLM (v0.33.0) headless "
        "multiproc executor, with head node address 10.0.0.1:29501 for torch.distributed"
    ) == ("starting (headless)")
