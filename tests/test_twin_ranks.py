"""Two twin ranks over real TCP: rendezvous, no serving before the join, dying together."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from sim.diffcheck import compare, logclass
from tests.support.twin import REPO, Twin, free_port, wait_http

# what real vLLM 0.32 did in each scenario (python -m sim.diffcheck peer-loss; provenance inside)
PEER_LOSS = REPO / "tests" / "data" / "real_engine" / "peer_loss.json"
# rank 1 frozen (SIGSTOP) under a request, and past the step timeout (same command)
FROZEN = REPO / "tests" / "data" / "real_engine" / "frozen_rank.json"


def sim_lines_unlike_the_real(
    scenario: str, rank: int, log_after: str, record: Path = PEER_LOSS
) -> list[str]:
    """The twin's log lines (after an event) whose class the real engine never printed in
    the same scenario; the twin's own SparkTwin lines excepted."""
    real = json.loads(record.read_text())["scenarios"][scenario][f"rank{rank}_log_classes"]
    found = compare.compare_logs(scenario, logclass.classes(log_after.splitlines()), real)
    return [f.sim for f in found if f.what in ("sim-only line", "sim-only GPU-path line")]


def pair_args(master_port: int, rank: int, http_port: int | None = None) -> list[str]:
    args = [
        "dsv4",
        "-tp",
        "2",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        "--twin-profile",
        "rehearsal",
    ]
    if rank == 1:
        args.append("--headless")
    else:
        args += ["--host", "127.0.0.1", "--port", str(http_port)]
    return args


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def procs():
    started: list[Twin] = []
    yield started
    for t in started:
        t.stop()


def serving_pair(tmp_path, procs) -> tuple[Twin, Twin, str]:
    mport, hport = free_port(), free_port()
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0")
    r1 = Twin(pair_args(mport, 1), tmp_path, "r1")
    procs += [r0, r1]
    base = f"http://127.0.0.1:{hport}"
    wait_http(base + "/health", timeout=45)  # generous: a loaded 2-core box
    return r0, r1, base


def chat(base: str, **extra) -> requests.Response:
    body = {"model": "dsv4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return requests.post(base + "/v1/chat/completions", json={**body, **extra}, timeout=30)


def test_rank0_waits_for_rank1_before_serving(tmp_path, procs):
    mport, hport = free_port(), free_port()
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0")
    procs.append(r0)
    # vLLM's worker line right before init_process_group blocks on the master's store
    r0.wait_log(f"distributed_init_method=tcp://127.0.0.1:{mport} backend=nccl")
    time.sleep(2.5)  # a single process would be serving by now
    assert not port_open(hport) and r0.proc.poll() is None
    r1 = Twin(pair_args(mport, 1), tmp_path, "r1")
    procs.append(r1)
    wait_http(f"http://127.0.0.1:{hport}/health", timeout=15)
    assert "rank 0 in world size 2 is assigned as" in r0.log()
    assert "rank 1 in world size 2 is assigned as" in r1.log()
    assert "(Worker_TP1 pid=" in r1.log() and "Graph capturing finished" in r1.log()


def test_rank1_killed_idle_head_stays_healthy_until_the_next_request(tmp_path, procs):
    """vLLM 0.32, measured: /health stays 200 after rank 1 dies; the next request gets 500
    EngineDeadError (the worker's gloo all-reduce: "Connection closed by peer"); /health
    503, the socket closes, and rank 0 exits 0 about 1.5 s after that request."""
    r0, r1, base = serving_pair(tmp_path, procs)
    assert chat(base).status_code == 200
    r1.kill()
    r1.wait_exit(5)
    for _ in range(6):
        time.sleep(0.5)
        assert requests.get(base + "/health", timeout=5).status_code == 200
    assert r0.proc.poll() is None
    t0 = time.monotonic()
    r = chat(base)
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) for the root "
            "cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    assert requests.get(base + "/health", timeout=5).status_code == 503
    assert r0.wait_exit(10) == 0
    assert 0.8 < time.monotonic() - t0 < 8
    log = r0.log()
    order = [
        "WorkerProc hit an exception.",
        "Connection closed by peer [127.0.0.1]:",
        "EngineCore encountered a fatal error.",
        "RuntimeError: Worker failed with error '",
        "AsyncLLM output_handler failed.",
        "EngineDeadError: EngineCore encountered an issue.",
        "[shutdown] Executor: waiting for worker exit count=1",
        "Parent process exited, terminating worker queues",
        "INFO:     Shutting down",
        "INFO:     Finished server process",
        "[shutdown] MPClient: complete",
    ]
    assert [log.index(x) for x in order] == sorted(log.index(x) for x in order), log
    assert "rank 1 is gone" not in log  # no line of the twin's own: vLLM prints none
    after = log[log.index("Application startup complete.") :].split("\n", 1)[1]
    assert sim_lines_unlike_the_real("rank1_killed_idle", 0, after) == []


def test_rank1_killed_mid_stream_ends_the_stream_with_the_error(tmp_path, procs):
    """vLLM 0.32, measured: a stream in flight when rank 1 dies ends with an SSE error event
    (EngineDeadError's message, code 500) and [DONE] within ~2 s (status stays 200: the
    headers went out long before); rank 0 exits 0 some 4-6 s after that event."""
    r0, r1, base = serving_pair(tmp_path, procs)
    body = {
        "model": "dsv4",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5000,
        "ignore_eos": True,
        "stream": True,
    }
    events = []
    with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line:
                continue
            events.append(line[6:].decode())
            if len(events) == 5:
                r1.kill()
                t_kill = time.monotonic()
    t_end = time.monotonic()
    assert t_end - t_kill < 5
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) for the root "
            "cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    assert r0.wait_exit(20) == 0
    assert 3 < time.monotonic() - t_end < 15
    log = r0.log()
    assert "Read error [127.0.0.1]:" in log and "Connection reset by peer." in log
    assert "Error in chat completion stream generator." in log
    after = log[log.index("Application startup complete.") :].split("\n", 1)[1]
    assert sim_lines_unlike_the_real("rank1_killed_mid_stream", 0, after) == []


def test_sigterm_to_joined_rank1_escalates_its_worker_then_the_head_fails_its_next_request(
    tmp_path, procs
):
    """vLLM 0.32, measured: SIGTERM to a serving pair's rank 1 ends it 14.3 s later (exit 0:
    grace VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, then the executor SIGTERMs and SIGKILLs its
    worker); rank 0 stays healthy throughout and after; its next request gets 500 and it
    exits 0. With a 1 s grace here: ~10 s."""
    mport, hport = free_port(), free_port()
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0")
    r1 = Twin(
        pair_args(mport, 1), tmp_path, "r1", env={"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "1"}
    )
    procs += [r0, r1]
    base = f"http://127.0.0.1:{hport}"
    wait_http(base + "/health", timeout=45)
    mark = len(r1.log())
    t0 = time.monotonic()
    r1.kill(signal.SIGTERM)
    time.sleep(3)
    assert r1.proc.poll() is None
    assert requests.get(base + "/health", timeout=5).status_code == 200
    assert r1.wait_exit(25) == 0
    assert 8 < time.monotonic() - t0 < 25
    log = r1.log()
    order = [
        "(Worker_TP1 pid=",
        "Parent process exited, terminating worker queues",
        "[shutdown] Executor: waiting for worker exit count=1",
        "workers still running after grace period; sending SIGTERM count=1",
        "workers still running after SIGTERM; sending SIGKILL count=1",
    ]
    assert [log.index(x) for x in order] == sorted(log.index(x) for x in order), log
    assert sim_lines_unlike_the_real("sigterm_rank1", 1, log[mark:]) == []
    assert requests.get(base + "/health", timeout=5).status_code == 200
    assert chat(base).status_code == 500
    assert r0.wait_exit(10) == 0


def test_fault_crash_in_rank1_phase_takes_pair_down(tmp_path, procs):
    mport, hport = free_port(), free_port()
    env = {"TWIN_FAULT": "crash:compiling:rank1"}
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0", env=env)
    r1 = Twin(pair_args(mport, 1), tmp_path, "r1", env=env)
    procs += [r0, r1]
    assert r1.wait_exit(15) == 1
    assert r0.wait_exit(6) != 0
    assert "injected fault crash:compiling" in r1.log()
    assert "rank 1 is gone" in r0.log() and "Application startup complete" not in r0.log()
    assert not port_open(hport)


def test_single_process_faults_and_bad_specs(tmp_path, procs):
    t = Twin(
        [
            "m",
            "--port",
            str(free_port()),
            "--twin-profile",
            "rehearsal",
            "--twin-fault",
            "slow-boot:3;crash:graphs",
        ],
        tmp_path,
        "one",
    )
    procs.append(t)
    assert t.wait_exit(15) == 1
    log = t.log()
    assert "Loading weights took 1.16 seconds" in log and "injected fault crash:graphs" in log
    bad = Twin(["m", "--twin-fault", "explode:now"], tmp_path, "bad")
    procs.append(bad)
    assert bad.wait_exit(10) == 2
    assert "not understood" in bad.log()


def test_sigterm_ends_each_phase_as_vllm_does(tmp_path, procs):
    """One SIGTERM path, installed before the boot phases (as vLLM's run_server does). The
    head while booting: run_server's KeyboardInterrupt("terminated"), uncaught, so the
    process ends by SIGINT (docker: exit 130). The head while serving and the headless
    rank in any phase: vLLM's [shutdown] lines, exit 0."""
    port = free_port()
    booting = Twin(
        ["m", "--port", str(free_port()), "--twin-profile", "rehearsal"]
        + ["--twin-fault", "slow-boot:50"],
        tmp_path,
        "booting",
    )
    joining = Twin(pair_args(free_port(), 1), tmp_path, "joining")  # no rank 0 ever comes
    serving = Twin(
        ["m", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"],
        tmp_path,
        "serving",
    )
    procs += [booting, joining, serving]
    booting.wait_log("Loading model from scratch...")
    joining.wait_log("distributed_init_method=tcp://")
    serving.wait_log("Application startup complete.", timeout=15)
    for twin in (booting, joining, serving):
        twin.kill(signal.SIGTERM)
    assert booting.wait_exit(5) == -signal.SIGINT
    assert booting.log().rstrip().endswith("KeyboardInterrupt: terminated")
    assert joining.wait_exit(5) == 0
    assert "[shutdown] Executor: all workers exited gracefully" in joining.log()
    assert serving.wait_exit(5) == 0
    log = serving.log()
    assert log.index("[shutdown] API server: shutdown triggered") < log.index(
        "INFO:     Application shutdown complete."
    )
    for twin in (booting, joining, serving):
        assert "received SIGTERM" not in twin.log()


def test_step_past_execute_timeout_kills_the_server(tmp_path, procs):
    """A step that runs past VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS ends the engine the way the
    measured frozen-rank timeout did (tests/data/real_engine/frozen_rank.json): the request
    gets EngineDeadError's 500 body, and the server exits as the real one did."""
    real = json.loads(FROZEN.read_text())["scenarios"]["rank1_frozen_past_timeout"]
    port = free_port()
    t = Twin(
        [
            "m",
            "-tp",
            "2",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--twin-profile",
            "rehearsal",
        ],
        tmp_path,
        "timeout",
        env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1", "TWIN_FAULT": "stall:1:30"},
    )
    procs.append(t)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", timeout=15)
    r = requests.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=20)
    assert r.status_code == real["request"]["status"] == 500
    assert r.json() == json.loads(real["request"]["tail"])
    assert t.wait_exit(10) == real["rank0_exit_code"]
    log = t.log()
    assert "(EngineCore pid=" in log and "EngineCore encountered a fatal error." in log
    assert "TimeoutError: RPC call to execute_model timed out." in log


def _chat_in_background(base: str) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            r = chat(base, max_tokens=8)
            box.update(status=r.status_code, body=r.json())
        except requests.RequestException as exc:
            box.update(status=None, body=type(exc).__name__)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def test_frozen_rank1_stalls_the_head_until_it_resumes(tmp_path, procs):
    """SIGSTOP of rank 1 (a hung host): as on the real CPU pair, /health stays 200, a request
    gets no answer while rank 1 is frozen, and completes once it resumes; nothing dies."""
    real = json.loads(FROZEN.read_text())["scenarios"]["rank1_frozen"]
    r0, r1, base = serving_pair(tmp_path, procs)
    assert chat(base).status_code == 200
    r1.kill(signal.SIGSTOP)
    try:
        th, box = _chat_in_background(base)
        th.join(6)  # far longer than the rehearsal profile needs for 8 tokens
        answered_while_frozen = not th.is_alive()
        health = requests.get(base + "/health", timeout=5).status_code
    finally:
        r1.kill(signal.SIGCONT)
    th.join(30)
    assert answered_while_frozen is real["request_answered_while_frozen"] is False
    assert health == real["health_while_frozen"][-1][1] == 200
    assert box["status"] == real["request"]["status"] == 200
    assert box["body"]["choices"][0]["finish_reason"] == "length"
    after = chat(base)
    assert after.status_code == real["request_after_resume"]["status"] == 200
    assert r0.proc.poll() is real["rank0_exit_code"] is None
    assert r1.proc.poll() is real["rank1_exit_code"] is None


def test_rank1_frozen_past_the_step_timeout_ends_the_head_and_rank1_lives_on(tmp_path, procs):
    """Frozen longer than VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: the waiting request gets 500
    when the timeout runs out (not before), rank 0 exits as the real one did, and rank 1,
    resumed, stays up (a headless rank never exits on its own), as recorded."""
    real = json.loads(FROZEN.read_text())["scenarios"]["rank1_frozen_past_timeout"]
    step_timeout = 4.0
    mport, hport = free_port(), free_port()
    env = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(step_timeout)}
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0", env=env)
    r1 = Twin(pair_args(mport, 1), tmp_path, "r1", env=env)
    procs += [r0, r1]
    base = f"http://127.0.0.1:{hport}"
    wait_http(base + "/health", timeout=45)
    assert chat(base).status_code == 200
    r1.kill(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        th, box = _chat_in_background(base)
        th.join(step_timeout + 20)
        answered_s = time.monotonic() - t0
    finally:
        r1.kill(signal.SIGCONT)
    assert not th.is_alive()
    assert answered_s >= step_timeout  # the timeout, not the freeze, ended it
    assert real["request_answered_after_freeze_s"] >= real["step_timeout_s"]
    assert box["status"] == real["request"]["status"] == 500
    assert box["body"] == json.loads(real["request"]["tail"])
    assert r0.wait_exit(15) == real["rank0_exit_code"] == 0
    time.sleep(2)
    assert r1.proc.poll() is None and real["rank1_alive_45_s_after_resume"] is True
    log = r0.log()
    after = log[log.index("Application startup complete.") :].split("\n", 1)[1]
    assert "TimeoutError: RPC call to execute_model timed out." in after
    assert sim_lines_unlike_the_real("rank1_frozen_past_timeout", 0, after, FROZEN) == []


def test_handshake_rejects_a_worker_with_another_model():
    import threading

    from sim.twin.ranks import RendezvousError, join_rendezvous, serve_rendezvous

    port, errors = free_port(), {}

    def head():
        try:
            serve_rendezvous("127.0.0.1", port, "model-a", join_timeout=10)
        except RendezvousError as exc:
            errors["head"] = str(exc)

    th = threading.Thread(target=head)
    th.start()
    with pytest.raises(RendezvousError, match="rejected.*model mismatch"):
        join_rendezvous("127.0.0.1", port, "model-b", join_timeout=10)
    th.join(5)
    assert "model mismatch" in errors["head"]
    # torch's own wording when the master's store never answers (c10d TCPStore)
    with pytest.raises(RendezvousError, match=r"DistNetworkError: The client socket has timed out"):
        join_rendezvous("127.0.0.1", free_port(), "model-a", join_timeout=0.6)
    with pytest.raises(RendezvousError, match=r"waiting for clients\. 1/2 clients joined\."):
        serve_rendezvous("127.0.0.1", free_port(), "model-a", join_timeout=1.0)


def test_a_worker_waits_for_a_slow_head_on_the_connection_it_made():
    """A loaded head may take seconds to read the hello of a connection it accepted. The
    worker waits on that connection (as torch's store client does) instead of hanging up
    after 2 s and dialling again: that left the head holding a dead socket (ENOTCONN on its
    next call) and the boot failed, in a CI run at load 9."""
    import threading

    from sim.twin.ranks import join_rendezvous

    port, seen = free_port(), []
    srv = socket.create_server(("127.0.0.1", port))

    def slow_head():
        conn, _ = srv.accept()
        seen.append(conn)
        time.sleep(3.0)  # past the worker's 2 s connect timeout
        hello = json.loads(conn.makefile("r").readline())
        assert hello["type"] == "hello"
        conn.sendall(b'{"type": "welcome"}\n')
        srv.settimeout(1.0)
        try:
            seen.append(srv.accept()[0])  # a second dial would land here
        except TimeoutError:
            pass

    th = threading.Thread(target=slow_head)
    th.start()
    sock = join_rendezvous("127.0.0.1", port, "model-a", join_timeout=20)
    th.join(10)
    srv.close()
    assert len(seen) == 1, "the worker hung up and dialled again"
    assert sock.getpeername()[1] == port
    sock.close()
    seen[0].close()
