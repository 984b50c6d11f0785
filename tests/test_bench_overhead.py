"""Client overhead at 64 concurrent streams, against a server that stamps in the kernel.

The simulator's /twin/requests times are taken in Python (do_POST start, the modelled step end),
so on a shared 2-core box its own GIL queueing of 64 arrivals shows up as tens of ms that are not
the client's. To measure the *client's* error, this server stamps where the network does:
SO_TIMESTAMPING gives it the kernel arrival time of each request head and the kernel departure
time of its first token event. Truth TTFT = departure - arrival; the client's TTFT may differ
from it only by two loopback hops (microseconds) plus its own error. The same comparison against
the simulator is printed by test_bench_twin.py::test_client_ttft_overhead_at_64_streams.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time

import pytest

from bench.benchlib.cli import base_parser
from bench.benchlib.runner import Bench

SO_TIMESTAMPING = 37
FLAGS = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 11)  # TX_SW | RX_SW | SOFTWARE | OPT_TSONLY
TTFT_S = 0.08


def _stamp(anc: list) -> int | None:
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING and len(cdata) >= 16:
            sec, nsec = struct.unpack_from("qq", cdata)
            if sec:
                return sec * 1_000_000_000 + nsec
    return None


def _tx_last(c: socket.socket) -> int | None:
    """Newest departure stamp in the error queue (drains it)."""
    last = None
    c.setblocking(False)
    try:
        while True:
            try:
                _d, anc, _f, _a = c.recvmsg(64, 512, socket.MSG_ERRQUEUE)
            except BlockingIOError:
                return last
            last = _stamp(anc) or last
    finally:
        c.setblocking(True)


class KernelStampServer:
    """Minimal chat-completions SSE server; records kernel arrival/departure per request."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.truth: dict[str, float] = {}
        self.lock = threading.Lock()
        self.n = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, FLAGS)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        with self.lock:
            self.n += 1
            rid = f"k-{self.n}"
        # One byte first: its stamp is the head's segment, not a later one read in the same call.
        buf, anc, _f, _a = c.recvmsg(1, 512)
        rx = _stamp(anc)
        while b"\r\n\r\n" not in buf:
            buf += c.recv(65536)
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += c.recv(65536)
        ev = {"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        c.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-Id: "
            + rid.encode()
            + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(ev)
        )
        _tx_last(c)
        off = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
        time.sleep(max(0.0, (rx - off) / 1e9 + TTFT_S - time.monotonic()))
        c.sendall(_chunk({"id": rid, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
        tx = _tx_last(c)
        with self.lock:  # before the stream can end, so the client never looks too early
            self.truth[rid] = (tx - rx) / 1e6
        time.sleep(0.02)
        for _ in range(3):
            c.sendall(_chunk({"id": rid, "choices": [{"index": 0, "delta": {"content": " x"}}]}))
            time.sleep(0.01)
        usage = {"prompt_tokens": 5, "completion_tokens": 4}
        c.sendall(_chunk({"id": rid, "choices": [], "usage": usage}) + b"0\r\n\r\n")
        c.close()

    def close(self) -> None:
        self.srv.close()


def _chunk(obj: dict) -> bytes:
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPING is Linux-only")
def test_client_ttft_within_1ms_of_kernel_truth_at_64_streams(capsys):
    srv = KernelStampServer()
    old = sys.getswitchinterval()
    try:
        b = Bench("t", base_parser("t").parse_args(["--url", srv.url, "--settle-ms", "200"]))
        b.model = "m"
        payloads = [b.chat_payload([{"role": "user", "content": f"s{i}"}], 4) for i in range(64)]
        res = b.stream_wave(payloads, None)
    finally:
        sys.setswitchinterval(old)
        srv.close()
    assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
    diff = [(r.t_first_token_ns - r.t_request_ns) / 1e6 - srv.truth[r.request_id] for r in res]
    lag = [r.wake_lag_max_ms for r in res if r.wake_lag_max_ms is not None]
    with capsys.disabled():
        print(
            f"\n64 streams vs kernel truth: |client - server| TTFT median "
            f"{statistics.median(map(abs, diff)) * 1000:.0f} us, max "
            f"{max(map(abs, diff)) * 1000:.0f} us; the kernel stamps hid thread wake-up lags up "
            f"to {max(lag):.1f} ms"
        )
    # Median and p95 within 1 ms; the max is printed (a rare outlier reaches ~1 ms on a loaded
    # box: loopback delivery itself is then delayed between the two kernels' stamps).
    err = sorted(abs(d) for d in diff)
    assert statistics.median(err) <= 1.0
    assert err[int(0.95 * len(err)) - 1] <= 1.0, err[-5:]
