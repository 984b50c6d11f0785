"""The one fake OpenAI/vLLM server of the tests: stdlib, known timings, configured per test.

Serves what the bench scripts, the quality gate and the launcher's health wait ask of a vLLM
endpoint: /health, /v1/models, /metrics (vLLM's names), /tokenize and /v1/chat/completions.
Streams chat completions as vLLM does (role-only chunk first, then token events, then a usage
chunk, then [DONE]) with a fixed TTFT and a fixed step period, each step carrying a known number
of tokens. Knobs let tests inject foreign traffic, gauge lag, a busy server, quality-gate
answers, errors, slowness and malformed JSON, and have the server stamp request arrival and
first-token departure in the kernel (the truth the client's own TTFT is checked against).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pairctl.endpoint import Endpoint

# The bench flags every test against this server uses: no warmups, a fast guard (its mock
# requests last tens of ms), no progress bar.
FAST_BENCH_FLAGS = [
    "--warmups",
    "0",
    "--guard-interval-ms",
    "30",
    "--guard-grace-ms",
    "200",
    "--backoff-s",
    "0.05",
    "--settle-ms",
    "5",
    "--no-progress",
]


@dataclass
class MockConfig:
    ttft_s: float = 0.05  # request received -> first token event
    step_s: float = 0.02  # period of decode steps
    tokens_per_step: tuple[int, ...] = (3,)  # cycled; accepted = n - 1 per step
    prefill_tok_s: float | None = None  # if set, TTFT = ttft_s + prompt_tokens / prefill_tok_s
    count_lag_s: float = 0.0  # server gauge forgets a finished request this late
    start_lag_s: float = 0.0  # and notices a new one this late (tokenization)
    answers: dict[str, str] = field(default_factory=dict)  # quality gate: prompt -> content
    mode: str = "ok"  # ok | slow | http500 | badjson | nogauges
    slow_s: float = 5.0
    model_id: str = "mock-model"  # the one model of /v1/models
    owned_by: str = "mock"  # its owned_by ("spark-twin-simulator" makes it look like the twin)
    models_body: dict[str, Any] | None = None  # answer /v1/models with this instead
    running_base: int = 0  # requests the server reports running besides the tests' own
    waiting_base: int = 0  # and waiting
    kernel_stamps: bool = False  # record kernel_ttft_ms per request (Linux SO_TIMESTAMPING)
    spec_metrics: bool = False  # send per-request spec-decode metrics, as vLLM does with
    # --per-request-spec-decode-metrics summary (the guard can then conserve acceptance)
    api_key: str | None = None  # require "Authorization: Bearer KEY" on /v1, as vLLM does


# Linux SO_TIMESTAMPING (Documentation/networking/timestamping.rst); written out here, not taken
# from bench.benchlib.kstamp, so the truth does not share code with the client it checks.
SO_TIMESTAMPING = 37
TS_FLAGS = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 11)  # TX_SW | RX_SW | SOFTWARE | OPT_TSONLY


def _kernel_stamp(anc: list) -> int | None:
    """Realtime ns of a SO_TIMESTAMPING control message (its first, software, timespec)."""
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING and len(cdata) >= 16:
            sec, nsec = struct.unpack_from("qq", cdata)
            if sec:
                return sec * 1_000_000_000 + nsec
    return None


def _last_departure(sock: socket.socket) -> int | None:
    """Newest departure stamp in the socket's error queue (drains it)."""
    last = None
    sock.setblocking(False)
    try:
        while True:
            try:
                _d, anc, _f, _a = sock.recvmsg(64, 512, socket.MSG_ERRQUEUE)
            except BlockingIOError:
                return last
            last = _kernel_stamp(anc) or last
    finally:
        sock.setblocking(True)


class MockState:
    def __init__(self, cfg: MockConfig) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        self.running = 0
        self.foreign_until: list[float] = []
        # Counted when vLLM 0.33 counts them (see bench/benchlib/conserve.py): lookups at
        # admission, the prompt at the first token, tokens as they go out, success at the end.
        self.counters = {
            "prompt_tokens": 0.0,
            "generation_tokens": 0.0,
            "prefix_cache_queries": 0.0,
            "request_success": 0.0,
            "spec_decode_num_drafts": 0.0,
            "spec_decode_num_draft_tokens": 0.0,
            "spec_decode_num_accepted_tokens": 0.0,
        }
        self.per_pos = [0.0] * 5
        self.records: list[dict[str, Any]] = []

    def foreign(self) -> int:
        now = time.monotonic()
        return sum(1 for t in self.foreign_until if t > now)

    def metrics_text(self) -> str:
        with self.lock:
            running = self.running + self.foreign() + self.cfg.running_base
            waiting = float(self.cfg.waiting_base)
            c = dict(self.counters)
            pp = list(self.per_pos)
        lines = []
        if self.cfg.mode != "nogauges":
            lines += [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{engine="0",model_name="mock"}} {running}',
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{engine="0",model_name="mock"}} {waiting}',
            ]
        lines += [
            "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency.",
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="mock"} 1.0',
            'vllm:e2e_request_latency_seconds_count{model_name="mock"} 1.0',
            'vllm:e2e_request_latency_seconds_sum{model_name="mock"} 1.0',
        ]
        for k, v in c.items():
            label = ',finished_reason="length"' if k == "request_success" else ""
            lines += [
                f"# HELP vllm:{k}_total counter",
                f"# TYPE vllm:{k}_total counter",
                f'vllm:{k}_total{{engine="0",model_name="mock"{label}}} {v}',
            ]
        lines += [
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total per position",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        for i, v in enumerate(pp):
            lines.append(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                f'{{engine="0",model_name="mock",position="{i}"}} {v}'
            )
        return "\n".join(lines) + "\n"


def _prompt_tokens(body: dict[str, Any]) -> int:
    text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return max(1, len(text) // 4)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: MockState
    rx_kernel_ns: int | None = None  # kernel arrival of the request head (kernel_stamps only)

    def handle(self) -> None:
        if self.state.cfg.kernel_stamps:
            # Peek at the head's first byte: its ancillary data is the kernel's arrival stamp,
            # and http.server then reads the request as usual.
            _d, anc, _f, _a = self.connection.recvmsg(1, 512, socket.MSG_PEEK)
            self.rx_kernel_ns = _kernel_stamp(anc)
        super().handle()

    def log_message(self, *a: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _refused(self) -> bool:
        """vLLM's --api-key: /v1 without the bearer token is 401 {"error": "Unauthorized"}
        (vllm/entrypoints/serve/middleware/authenticate.py; /health and /metrics are open)."""
        key = self.state.cfg.api_key
        if key is None or not self.path.startswith("/v1"):
            return False
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return False
        self._send(401, b'{"error": "Unauthorized"}')
        return True

    def do_GET(self) -> None:
        st = self.state
        if self._refused():
            return
        if self.path == "/health":
            # vLLM answers 200 with an empty body while the engine lives
            # (vllm/entrypoints/serve/instrumentator/health.py).
            self._send(200, b"", "text/plain")
        elif self.path == "/v1/models":
            doc = {"object": "list", "data": [{"id": st.cfg.model_id, "owned_by": st.cfg.owned_by}]}
            self._send(200, json.dumps(st.cfg.models_body or doc).encode())
        elif self.path == "/metrics":
            self._send(200, st.metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/mock/requests":
            with st.lock:
                self._send(200, json.dumps(st.records).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        received = time.monotonic_ns()
        st = self.state
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        if self._refused():
            return
        if self.path == "/mock/foreign":
            with st.lock:
                st.foreign_until += [time.monotonic() + body["seconds"]] * body["requests"]
            self._send(200, b"{}")
        elif self.path == "/tokenize":
            self._send(200, json.dumps({"count": _prompt_tokens(body)}).encode())
        elif self.path == "/v1/chat/completions":
            if st.cfg.mode == "http500":
                self._send(500, b'{"error": {"message": "boom"}}')
            elif body.get("stream"):
                self._stream(body, received)
            else:
                self._complete(body)
        elif self.path == "/v1/completions":  # watch's and status's 1-token probe
            if st.cfg.mode == "http500":
                self._send(500, b'{"error": {"message": "boom"}}')
                return
            n_out = int(body.get("max_tokens") or 16)
            doc = {
                "id": "cmpl-2",
                "object": "text_completion",
                "choices": [{"index": 0, "text": " 4" * n_out, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": n_out,
                    "total_tokens": 3 + n_out,
                },
            }
            self._send(200, json.dumps(doc).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def _complete(self, body: dict[str, Any]) -> None:
        cfg = self.state.cfg
        if cfg.mode == "slow":
            time.sleep(cfg.slow_s)
        prompt = body["messages"][-1]["content"]
        answer = cfg.answers.get(prompt, "I do not know.")
        if cfg.mode == "badjson":
            self._send(200, b'{"choices": [{"message": {"content": "4')
            return
        doc = {
            "id": "cmpl-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        }
        self._send(200, json.dumps(doc).encode())

    def _chunk(self, obj: dict[str, Any] | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _stream(self, body: dict[str, Any], received: int) -> None:
        st, cfg = self.state, self.state.cfg
        max_tokens = int(body.get("max_tokens") or 16)
        ptoks = _prompt_tokens(body)
        rid = f"mock-{received}"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Request-Id", rid)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if cfg.start_lag_s:
            time.sleep(cfg.start_lag_s)
        with st.lock:
            st.running += 1
            st.counters["prefix_cache_queries"] += ptoks
        spec = [0] * 6  # verify steps by accepted drafts (the per-request histogram)
        try:
            base = {"id": rid, "object": "chat.completion.chunk", "model": cfg.model_id}
            self._chunk(base | {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            ttft = cfg.ttft_s + (ptoks / cfg.prefill_tok_s if cfg.prefill_tok_s else 0.0)
            deadline = received / 1e9 + ttft  # from arrival, so our own overheads do not add
            time.sleep(max(0.0, deadline - time.monotonic()))
            first_token = time.monotonic_ns()
            record = {"id": rid, "received_ns": received, "first_token_ns": first_token}
            if cfg.kernel_stamps:
                _last_departure(self.connection)  # drop the stamps of the head and role chunk
            with st.lock:
                st.counters["prompt_tokens"] += ptoks
                st.counters["generation_tokens"] += 1
            self._chunk(base | {"choices": [{"index": 0, "delta": {"content": "w0"}}]})
            if cfg.kernel_stamps:
                tx, rx = _last_departure(self.connection), self.rx_kernel_ns
                record["kernel_ttft_ms"] = (tx - rx) / 1e6 if tx and rx else None
            with st.lock:  # before the stream can end, so a client never looks too early
                st.records.append(record)
            done, step = 1, 0
            while done < max_tokens:
                k = min(cfg.tokens_per_step[step % len(cfg.tokens_per_step)], max_tokens - done)
                deadline += cfg.step_s
                time.sleep(max(0.0, deadline - time.monotonic()))
                self._chunk(base | {"choices": [{"index": 0, "delta": {"content": " w" * k}}]})
                with st.lock:
                    st.counters["spec_decode_num_drafts"] += 1
                    st.counters["spec_decode_num_draft_tokens"] += 5
                    st.counters["spec_decode_num_accepted_tokens"] += k - 1
                    st.counters["generation_tokens"] += k
                    for p in range(k - 1):
                        st.per_pos[p] += 1
                spec[k - 1] += 1
                done += k
                step += 1
            with st.lock:
                st.counters["request_success"] += 1
            finish = time.monotonic_ns()
            fin = {"index": 0, "delta": {}, "finish_reason": "length"}
            self._chunk(base | {"choices": [fin]})
            usage = {"prompt_tokens": ptoks, "completion_tokens": done}
            last = base | {"choices": [], "usage": usage}
            if cfg.spec_metrics:
                acc = sum(j * c for j, c in enumerate(spec))
                last["metrics"] = {
                    "speculative_decoding": {
                        "acceptance_histogram": spec,
                        "num_spec_steps": sum(spec),
                        "num_accepted_draft_tokens": acc,
                        "num_draft_tokens": 5 * sum(spec),
                        "num_spec_tokens": 5,
                    }
                }
            self._chunk(last)
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with st.lock:
                record.update(finish_ns=finish, prompt_tokens=ptoks, completion_tokens=done)
        except OSError:
            pass  # the client hung up (e.g. the guard aborted its wave)
        finally:
            if cfg.count_lag_s:
                threading.Timer(cfg.count_lag_s, self._forget).start()
            else:
                self._forget()

    def _forget(self) -> None:
        with self.state.lock:
            self.state.running -= 1


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a 64-stream wave connects at once; the default 5 drops SYNs
    kernel_stamps = False

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.kernel_stamps:
            # Before the request arrives, or its arrival carries no stamp.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TS_FLAGS)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is part of the tests


class MockServer:
    """Context manager: `with MockServer(MockConfig(...)) as m: m.url`."""

    def __init__(self, cfg: MockConfig | None = None) -> None:
        self.state = MockState(cfg or MockConfig())
        handler = type("H", (Handler,), {"state": self.state})
        self.httpd = _Quiet(("127.0.0.1", 0), handler)
        self.httpd.kernel_stamps = self.state.cfg.kernel_stamps
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoint = Endpoint.parse(self.url)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MockServer:
        self.thread.start()
        return self

    def __exit__(self, *a: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def records(self) -> list[dict[str, Any]]:
        """One record per streamed request, from its first token on (finish fields at the end)."""
        with self.state.lock:
            return [dict(r) for r in self.state.records]

    def inject_foreign(self, requests: int, seconds: float) -> None:
        """Foreign requests in flight for `seconds` (the gauge shows them), counted as they
        arrive: 64 prompt tokens and one token each (counters do not care about timing)."""
        with self.state.lock:
            self.state.foreign_until += [time.monotonic() + seconds] * requests
        self.count_foreign(requests)

    def count_foreign(self, requests: int, prompt_tokens: int = 64, tokens: int = 1) -> None:
        """Counters of foreign requests that came and went between two gauge samples."""
        with self.state.lock:
            c = self.state.counters
            c["prefix_cache_queries"] += prompt_tokens * requests
            c["prompt_tokens"] += prompt_tokens * requests
            c["generation_tokens"] += tokens * requests
            c["request_success"] += requests
