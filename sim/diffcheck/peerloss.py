"""What a real vLLM pair does when a node goes away or freezes: six scenarios, measured.

Each scenario boots a fresh loopback pair (sim/diffcheck/pair.py), sends one warm-up
request, then: rank 1 SIGKILLed while idle; rank 1 SIGKILLed while a stream is running; rank
0 SIGKILLed (what becomes of the headless rank 1); SIGTERM to rank 1's main process (docker
stop); rank 1 frozen (SIGSTOP of its whole node, as a hung host or a stopped container is)
for less than the engine's step timeout, then resumed; and frozen for longer than that
timeout (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, vllm/envs.py, enforced by
``MultiprocExecutor.collective_rpc`` in vllm/v1/executor/multiproc_executor.py). Recorded
per scenario: /health over time, the first request's status and body, how long each node
takes to exit and its exit code, and the log lines each node printed after the event (with
their classes, sim/diffcheck/logclass.py), so the simulator can be held to them
(tests/test_twin_ranks.py, docs/simulator.md).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import requests

from sim.diffcheck import logclass
from sim.diffcheck.pair import Pair

# traceback frames and code under a logger prefix, health probes, interpreter-exit noise
NOISE = re.compile(
    r'^\([^)]*\) (?:ERROR|INFO|WARNING) [\d\- :]+\[[^\]]+\] {2,}|"GET /health|'
    r"^\s*(?:File |\^|return |warnings\.warn|- leaked|- \.\.\.|nanobind|See https)|^\s*$"
)


def chat(base: str, model: str, stream: bool = False, max_tokens: int = 8) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    t0 = time.monotonic()
    try:
        r = requests.post(base + "/v1/chat/completions", json=body, timeout=180, stream=stream)
        text = r.text
        return {"status": r.status_code, "tail": text[-600:], "s": round(time.monotonic() - t0, 2)}
    except requests.RequestException as exc:
        return {"status": None, "tail": type(exc).__name__, "s": round(time.monotonic() - t0, 2)}


def _after(path, offset: int) -> list[str]:
    """The log's lines past ``offset``, minus traceback frames and health-probe lines."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", "replace")
    return [ln[:400] for ln in text.splitlines() if not NOISE.search(ln)]


def _health_series(pair: Pair, seconds: float, every: float) -> list[tuple[float, Any]]:
    t0, out = time.monotonic(), []
    while time.monotonic() - t0 < seconds:
        out.append((round(time.monotonic() - t0, 1), pair.health()))
        time.sleep(every)
    return out


def rank1_killed_idle(pair: Pair, model: str) -> dict[str, Any]:
    pair.kill(1)
    health = _health_series(pair, 10, 1.0)
    t_req = time.monotonic()
    first = chat(pair.base, model)
    after = _health_series(pair, 1.5, 0.5)
    rc = pair.wait_exit(0, 60)
    return {
        "health_after_kill": health,
        "first_request": first,
        "health_after_request": after,
        "rank0_exit_code": rc,
        "rank0_exit_after_request_s": round(time.monotonic() - t_req, 2)
        if rc is not None
        else None,
    }


def rank1_killed_mid_stream(pair: Pair, model: str) -> dict[str, Any]:
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(chat(pair.base, model, True, 3000)))
    th.start()
    time.sleep(4)
    t_kill = time.monotonic()
    pair.kill(1)
    th.join(180)
    t_resp = time.monotonic()
    health = pair.health()
    rc = pair.wait_exit(0, 60)
    return {
        "stream": box,
        "stream_end_after_kill_s": round(t_resp - t_kill, 2),
        "health_after_stream": health,
        "rank0_exit_code": rc,
        "rank0_exit_after_kill_s": round(time.monotonic() - t_kill, 2) if rc is not None else None,
    }


def rank0_killed(pair: Pair, model: str) -> dict[str, Any]:
    pair.kill(0)
    rc = pair.wait_exit(1, 45)
    return {"rank1_exit_code": rc, "rank1_alive_after_45_s": rc is None}


def sigterm_rank1(pair: Pair, model: str) -> dict[str, Any]:
    t0 = time.monotonic()
    pair.kill(1, signal.SIGTERM, group=False)
    health = []
    while pair.procs[1].poll() is None and time.monotonic() - t0 < 60:
        health.append((round(time.monotonic() - t0, 1), pair.health()))
        time.sleep(2)
    rc1 = pair.procs[1].poll()
    t_exit = round(time.monotonic() - t0, 1)
    after = pair.health()
    t_req = time.monotonic()
    first = chat(pair.base, model)
    rc0 = pair.wait_exit(0, 30)
    return {
        "health_while_stopping": health,
        "rank1_exit_code": rc1,
        "rank1_exit_s": t_exit if rc1 is not None else None,
        "health_after_rank1_exit": after,
        "first_request": first,
        "rank0_exit_code": rc0,
        "rank0_exit_after_request_s": round(time.monotonic() - t_req, 2)
        if rc0 is not None
        else None,
    }


# How long the short freeze lasts, and the step timeout the long-freeze scenario boots with
# (short enough to wait for; the launcher's recipe uses 600 s).
FREEZE_S = 25.0
STEP_TIMEOUT_S = 15
FROZEN_PAST_TIMEOUT_S = 45.0
SCENARIO_ENV: dict[str, dict[str, str]] = {
    "rank1_frozen_past_timeout": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(STEP_TIMEOUT_S)},
}


def _request_in_background(base: str, model: str) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(chat(base, model)), daemon=True)
    th.start()
    return th, box


def rank1_frozen(pair: Pair, model: str) -> dict[str, Any]:
    """SIGSTOP rank 1's node for FREEZE_S while a request is sent, then SIGCONT."""
    t0 = time.monotonic()
    pair.kill(1, signal.SIGSTOP)
    health = _health_series(pair, 4, 1.0)
    th, box = _request_in_background(pair.base, model)
    while time.monotonic() - t0 < FREEZE_S:
        time.sleep(0.2)
    health += [(round(time.monotonic() - t0, 1), pair.health())]
    answered_while_frozen = not th.is_alive()
    t_cont = time.monotonic()
    pair.kill(1, signal.SIGCONT)
    th.join(120)
    return {
        "frozen_s": FREEZE_S,
        "health_while_frozen": health,
        "request_answered_while_frozen": answered_while_frozen,
        "request": box,
        "request_done_after_resume_s": round(time.monotonic() - t_cont, 2)
        if not answered_while_frozen
        else None,
        "request_after_resume": chat(pair.base, model),
        "rank0_exit_code": pair.procs[0].poll(),
        "rank1_exit_code": pair.procs[1].poll(),
    }


def rank1_frozen_past_timeout(pair: Pair, model: str) -> dict[str, Any]:
    """SIGSTOP rank 1's node for longer than the step timeout (STEP_TIMEOUT_S) with a
    request waiting on it; then what each node does, rank 1 resumed at the end."""
    t0 = time.monotonic()
    pair.kill(1, signal.SIGSTOP)
    th, box = _request_in_background(pair.base, model)
    th.join(FROZEN_PAST_TIMEOUT_S)
    answered_s = round(time.monotonic() - t0, 2) if not th.is_alive() else None
    health = pair.health()
    rc0 = pair.wait_exit(0, max(1.0, FROZEN_PAST_TIMEOUT_S - (time.monotonic() - t0)))
    rank0_exit_s = round(time.monotonic() - t0, 2) if rc0 is not None else None
    pair.kill(1, signal.SIGCONT)
    rc1 = pair.wait_exit(1, 45)
    return {
        "step_timeout_s": STEP_TIMEOUT_S,
        "request": box,
        "request_answered_after_freeze_s": answered_s,
        "health_after_request": health,
        "rank0_exit_code": rc0,
        "rank0_exit_after_freeze_s": rank0_exit_s,
        "rank1_exit_code": rc1,
        "rank1_alive_45_s_after_resume": rc1 is None,
    }


SCENARIOS: dict[str, Callable[[Pair, str], dict[str, Any]]] = {
    "rank1_killed_idle": rank1_killed_idle,
    "rank1_killed_mid_stream": rank1_killed_mid_stream,
    "rank0_killed": rank0_killed,
    "sigterm_rank1": sigterm_rank1,
    "rank1_frozen": rank1_frozen,
    "rank1_frozen_past_timeout": rank1_frozen_past_timeout,
}


def run(name: str, pair: Pair, model: str, boot_timeout: float) -> dict[str, Any]:
    """One scenario on a fresh pair; the pair is gone afterwards whatever happened."""
    try:
        out: dict[str, Any] = {"boot_s": round(pair.wait_ready(boot_timeout), 1)}
        out["warm_request"] = {k: v for k, v in chat(pair.base, model).items() if k != "tail"}
        time.sleep(2)
        marks = [p.stat().st_size for p in pair.log_paths]
        out.update(SCENARIOS[name](pair, model))
        time.sleep(1)
        for rank in (0, 1):
            lines = _after(pair.log_paths[rank], marks[rank])
            out[f"rank{rank}_log"] = lines
            out[f"rank{rank}_log_classes"] = logclass.classes(lines)
        return out
    finally:
        pair.stop()
