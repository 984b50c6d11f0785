"""The simulator as the bench tests use it: a fast profile, server-side records, foreign traffic.

Truth comes from the twin itself: /twin/truth (the closed-form figures of its performance model)
and /twin/requests (its record of every request: received, first token, finish, tokens, verify
steps, accepted drafts). `arm()` schedules a foreign request at an exact moment relative to the
next events the twin sees (a /metrics scrape, a request, a first token, a finish).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from pairctl.endpoint import Endpoint

REPO = Path(__file__).resolve().parents[2]

# Sampling that cannot see a short foreign request (no sample inside a wave of < 5 s): what
# catches it in these tests is token conservation alone.
BLIND = ["--guard-interval-ms", "5000"]
FAST = [
    "--warmups",
    "0",
    "--guard-interval-ms",
    "50",
    "--guard-grace-ms",
    "300",
    "--backoff-s",
    "0.2",
    "--settle-ms",
    "10",
    "--no-progress",
]
PROFILE = f"""profile_version: 1
name: bench-fast
base: {REPO}/sim/profiles/spark-pair.yaml
decode:
  step_ms_by_batch: {{1: 10.0, 4: 16.0, 16: 40.0, 24: 52.0}}
  fp8_draft_head_saving_ms: 0.0
prefill:
  tok_s: 100000
  step_base_ms: 10.0
boot:
  cold: {{loading_weights_s: 0.0, compiling_s: 0.0, capturing_graphs_s: 0.0}}
  warm: {{loading_weights_s: 0.0, compiling_s: 0.0, capturing_graphs_s: 0.0}}
  api_server_s: 0.0
  jit_stall_s: 0.0
answers:
  file: {REPO}/pairctl/gate/quality_ref_dspark.json
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Twin:
    """One simulator process on a free port, with the fast profile (or `profile` text)."""

    def __init__(self, tmp: Path, *flags: str, profile: str = PROFILE) -> None:
        prof = tmp / "bench-fast.yaml"
        prof.write_text(profile)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoint = Endpoint.parse(self.url)
        self.log_path = tmp / f"twin-{self.port}.log"
        env = dict(os.environ, TILELANG_CACHE_DIR=str(tmp / "tilelang"))
        env.pop("TWIN_FAULT", None)
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim.twin",
                "serve",
                "dsv4-flash",
                "--nnodes",
                "1",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--twin-profile",
                str(prof),
                *flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(self.url + "/v1/models", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"twin did not start: {self.log_path.read_text()}")
            time.sleep(0.2)
        self.truth = requests.get(self.url + "/twin/truth", timeout=5).json()["derived"]

    def records(self) -> dict[str, dict]:
        return {r["id"]: r for r in requests.get(self.url + "/twin/requests", timeout=10).json()}

    def foreign(self, n: int, seconds: float) -> None:
        requests.post(
            self.url + "/twin/foreign", json={"requests": n, "seconds": seconds}, timeout=5
        ).raise_for_status()

    def arm(self, after: str, offset_ms: float, nth: int = 1, tokens: int = 1) -> None:
        """One foreign request of `tokens` tokens, offset_ms after the nth next `after` event."""
        body = {"after": after, "nth": nth, "offset_ms": offset_ms, "tokens": tokens}
        requests.post(self.url + "/twin/foreign", json=body, timeout=5).raise_for_status()

    def wait_idle(self, timeout_s: float = 30) -> None:
        from bench.benchlib import promm

        s = requests.Session()
        deadline = time.monotonic() + timeout_s
        while promm.scrape(s, self.endpoint).in_flight and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def server_ttft_ms(rec: dict) -> float:
    return (rec["first_token_ns"] - rec["received_ns"]) / 1e6


# The twin's record stamps the modelled step end; its Python thread writes the token later, and
# the client's thread reads it later still: 0.5 ms idle, ~10 ms on a loaded 2-core box, 32 ms
# measured at load 9 (a CI run beside another test run, 2026-12-02). Two processes' clocks are
# therefore compared by order (the client's interval holds the server's) and with 3x headroom
# over the worst lag seen, never within a load-sized tolerance. One read can be far later: a
# clean-clone CI run on 2026-12-05 read one stream's first token 160 ms late, so a new bound on
# one request is causal only (assert_client_holds_the_servers_request) and a magnitude bound
# goes on a median of several.
LOADED_LAG_MS = 35.0
HEADROOM = 3.0


def assert_client_ttft_holds_the_servers(client_ms: float, rec: dict) -> None:
    """The client's TTFT of a request contains the server's (it sent before the server received,
    and read after the server wrote), and exceeds it by no more than 3x the loaded-box lag: a
    TTFT taken from another request or another attempt is off by a whole step or wave."""
    server = server_ttft_ms(rec)
    assert client_ms > server - 0.1, (client_ms, server)
    assert client_ms - server <= HEADROOM * LOADED_LAG_MS, (client_ms, server)


def assert_client_decode_spans_the_servers(client_tok_s: float, rec: dict) -> None:
    """The client's decode window (first token read to last token read) is the server's
    (first token written to finish) moved by each end's read lag: within 3x the loaded-box
    lag of it. A rate within 2% held on an idle box and not on a loaded one (396 vs 384
    tok/s over a ~310 ms window in a CI run)."""
    tokens = rec["completion_tokens"] - 1
    client_ms = tokens / client_tok_s * 1000
    server_ms = (rec["finish_ns"] - rec["first_token_ns"]) / 1e6
    assert abs(client_ms - server_ms) <= HEADROOM * LOADED_LAG_MS, (client_ms, server_ms)


def assert_client_holds_the_servers_request(m: dict, rec: dict) -> None:
    """Causality alone, which no load can break: the client sent before the server received
    and read each token after the server wrote it, so its TTFT and its latency (request_metrics
    `m`) each hold the server's. Its decode window, latency - TTFT, is then the server's moved
    by the two read lags; how far is load's to say (a clean-clone CI run saw a first token read
    160 ms late), so a bound on it belongs on a median of several requests."""
    assert m["ttft_ms"] > server_ttft_ms(rec) - 0.1, (m["ttft_ms"], rec)
    assert m["latency_ms"] > (rec["finish_ns"] - rec["received_ns"]) / 1e6 - 0.1, (
        m["latency_ms"],
        rec,
    )


def decode_window_gap_ms(client_tok_s: float, rec: dict) -> float:
    """|client decode window - the server's|, ms (see assert_client_decode_spans_the_servers)."""
    client_ms = (rec["completion_tokens"] - 1) / client_tok_s * 1000
    return abs(client_ms - (rec["finish_ns"] - rec["first_token_ns"]) / 1e6)


def record_decode_tok_s(rec: dict) -> float:
    """The decode rate of one request by the server's own record (first token to finish, one
    clock; the twin's records follow its modelled timeline, which absorbs host lag)."""
    return (rec["completion_tokens"] - 1) / ((rec["finish_ns"] - rec["first_token_ns"]) / 1e9)


def record_accept_len(recs: list[dict]) -> float:
    """Mean acceptance length of these requests as the server drew it (1 + accepted / steps)."""
    return 1 + sum(r["accepted_tokens"] for r in recs) / sum(r["verify_steps"] for r in recs)
