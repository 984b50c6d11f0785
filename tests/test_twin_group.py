"""Four twin ranks as one TP=4 group over real TCP: the N-rank argv the launcher writes
(`--nnodes 4 --node-rank R`, ranks 1..3 `--headless`), the head waiting for all of them,
and the loss of a rank other than rank 1."""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.twin import Twin, free_port, wait_http
from tests.test_twin_ranks import chat, port_open, procs  # noqa: F401 - the fixture


def group_args(master_port: int, rank: int, http_port: int | None = None) -> list[str]:
    args = ["dsv4", "-tp", "4", "--distributed-executor-backend", "mp", "--nnodes", "4"]
    args += ["--node-rank", str(rank), "--master-addr", "127.0.0.1"]
    args += ["--master-port", str(master_port), "--twin-profile", "rehearsal"]
    if rank:
        args.append("--headless")
    else:
        args += ["--host", "127.0.0.1", "--port", str(http_port)]
    return args


def test_the_head_serves_once_all_four_ranks_joined_and_a_dead_rank2_hangs_it(tmp_path, procs):  # noqa: F811
    """As in vLLM's TP group: init_process_group returns on no rank until every rank of the
    world is in, so three of four joined serve nothing. With rank 2 SIGKILLed, the head
    does what the real TP=4 group did (docs/rehearsal.md "A TP=4 group"): /health stays
    200, the next request gets no answer, nothing exits; the head's step waits as for a
    frozen rank, until VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS ends the engine (500, exit 0).
    The headless ranks 1 and 3 stay up, as an orphaned headless rank does."""
    mport, hport = free_port(), free_port()
    timeout = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "8"}
    ranks = [Twin(group_args(mport, 0, hport), tmp_path, "r0", env=timeout)]
    procs.append(ranks[0])
    for r in (1, 2):
        ranks.append(Twin(group_args(mport, r), tmp_path, f"r{r}"))
        procs.append(ranks[-1])
    ranks[2].wait_log(f"distributed_init_method=tcp://127.0.0.1:{mport} backend=nccl")
    time.sleep(3.0)  # a group of three would be serving by now
    assert not port_open(hport) and all(t.proc.poll() is None for t in ranks)
    assert "in world size 4 is assigned" not in ranks[0].log()
    ranks.append(Twin(group_args(mport, 3), tmp_path, "r3"))
    procs.append(ranks[-1])
    base = f"http://127.0.0.1:{hport}"
    wait_http(base + "/health", timeout=45)
    for r, t in enumerate(ranks):
        assert f"rank {r} in world size 4 is assigned as" in t.log(), r
    assert "(Worker_TP2 pid=" in ranks[2].log()
    assert chat(base).status_code == 200

    ranks[2].kill()
    ranks[2].wait_exit(5)
    time.sleep(1.0)
    assert requests.get(base + "/health", timeout=5).status_code == 200
    body = {"model": "dsv4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(requests.Timeout):
        requests.post(base + "/v1/chat/completions", json=body, timeout=3)
    assert ranks[0].proc.poll() is None
    assert requests.get(base + "/health", timeout=5).status_code == 200
    assert "Connection closed by peer" not in ranks[0].log()
    assert ranks[0].wait_exit(30) == 0  # the step timeout (8 s) ended the engine
    assert ranks[1].proc.poll() is None and ranks[3].proc.poll() is None
