"""Streaming request function: one OpenAI-style SSE request -> raw nanosecond timings.

Why a raw socket and not `requests`: on a shared 2-core client with 64 streams, the per-chunk
Python work of urllib3's chunked reader + iter_lines is what makes a client-side TTFT drift from the
server's. Here the receiving thread does the minimum per recv() — take `time.monotonic_ns()` and
append `(ts, bytes)` — and all HTTP/SSE parsing happens after the stream has closed. Every event is
stamped with the arrival time of the recv() that completed it (kstamp: kernel socket stamps;
response: the parsing).

Clock: `time.monotonic_ns()` (CLOCK_MONOTONIC), the same clock the simulator uses in
/twin/requests, so client and server times are directly comparable on one machine.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Protocol

from bench.benchlib import kstamp
from bench.benchlib.response import StreamResult, parse_response
from pairctl.endpoint import Endpoint


class InFlight(Protocol):
    """What the guard's tracker offers: we count ourselves in flight around each request."""

    def start(self) -> None: ...

    def finish(self) -> None: ...


def build_request(
    ep: Endpoint,
    path: str,
    payload: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[bytes, bytes]:
    """(head, body) of an HTTP/1.1 POST with Connection: close (end of stream = server closes).

    Head and body are sent separately: the head's departure stamp is when the request started
    to leave, however long a 128k-token body then takes to stream through the socket. The
    endpoint's own headers (bearer token, X-Session-ID) come first, then `headers`.
    """
    body = json.dumps(payload).encode()
    lines = [
        f"POST {ep.path}{path} HTTP/1.1",
        f"Host: {ep.host}:{ep.port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    lines += [f"{k}: {v}" for k, v in {**ep.headers(), **(headers or {})}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), body


def open_connection(ep: Endpoint, timeout_s: float = 600.0) -> socket.socket:
    """A connection to the endpoint's host, opened ahead of a wave (see kstamp.connect).

    Connecting ahead of a wave keeps the server's accept/handler start-up out of TTFT, as a
    client with a warm keep-alive pool would; connect time is reported apart.
    """
    return kstamp.connect(ep.host, ep.port, timeout_s)


def stream_request(
    ep: Endpoint,
    path: str,
    payload: dict[str, Any],
    *,
    timeout_s: float = 600.0,
    tracker: InFlight | None = None,
    sock: socket.socket | None = None,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """Send one streaming request and return its raw timings; never raises for HTTP/IO errors.

    `sock` may be a connection opened beforehand with open_connection(); it is consumed.
    The endpoint brings its bearer token and X-Session-ID; `headers` are extra request headers
    (e.g. X-Request-Id).
    The tracker counts this request in flight from before the request is written until after the
    socket is closed, which brackets the server's own view of it (it sees us later and forgets
    us earlier).
    """
    head, body = build_request(ep, path, payload, headers)
    res = StreamResult()
    rec = kstamp.Receiver()
    if tracker is not None:
        tracker.start()
    res.t_start_ns = time.monotonic_ns()
    try:
        if sock is None:
            sock = kstamp.connect(ep.host, ep.port, timeout_s)
        else:
            sock.settimeout(timeout_s)
        res.t_connected_ns = time.monotonic_ns()
        attach = getattr(tracker, "attach", None)
        if attach is not None:
            attach(sock)  # lets the guard cut a contaminated wave short
        rec.offset_ns = kstamp.clock_offset_cached()
        res.t_request_ns = t_before = time.monotonic_ns()
        sock.sendall(head)
        t_after = time.monotonic_ns()
        sock.sendall(body)
        # TTFT origin: when the head left, per the kernel (a thread preempted between its own
        # stamp and send() must not count that wait as server time).
        tx = kstamp.tx_stamps(sock, timeout_s)
        res.request_stamp = "user"
        if tx:
            k = min(tx) - rec.offset_ns
            # Plausibility bound only (same reasoning as kstamp.Receiver.stamps).
            if t_before - 1_000_000_000 < k < t_after + 1_000_000_000:
                res.t_request_ns, res.request_stamp = k, "kernel"
        rec.run(sock)
    except TimeoutError:
        res.error = f"timeout: no data for {timeout_s:g}s"
    except OSError as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        if sock is not None:
            detach = getattr(tracker, "detach", None)
            if detach is not None:
                detach(sock)
            sock.close()
        res.t_done_ns = time.monotonic_ns()
        if tracker is not None:
            tracker.finish()
    if getattr(tracker, "aborted", False):
        res.error = res.error or "aborted: the guard saw foreign traffic (wave discarded)"
    res.wake_lag_max_ms = rec.max_lag_ms()
    parse_response(res, rec.stamps(), rec.bufs)
    record = getattr(tracker, "record", None)
    if record is not None:
        record(res)  # the guard's conservation check sums every request of the wave
    return res
