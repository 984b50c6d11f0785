"""Streaming request function: one OpenAI-style SSE request -> raw nanosecond timings.

Why a raw socket and not `requests`: on a shared 2-core client with 64 streams, the per-chunk
Python work of urllib3's chunked reader + iter_lines is what makes a client-side TTFT drift from the
server's. Here the receiving thread does the minimum per recv() — take `time.monotonic_ns()` and
append `(ts, bytes)` — and all HTTP/SSE parsing happens after the stream has closed. Every event is
stamped with the arrival time of the recv() that completed it.

Clock: `time.monotonic_ns()` (CLOCK_MONOTONIC), the same clock the simulator uses in
/twin/requests, so client and server times are directly comparable on one machine.
"""

from __future__ import annotations

import bisect
import json
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit


class InFlight(Protocol):
    """What the guard's tracker offers: we count ourselves in flight around each request."""

    def start(self) -> None: ...

    def finish(self) -> None: ...


@dataclass
class StreamResult:
    """Raw facts about one streamed request. Times are monotonic ns; None = never happened."""

    ok: bool = False
    status: int | None = None
    error: str | None = None
    request_id: str | None = None  # server's X-Request-Id (the simulator's /twin/requests id)
    t_start_ns: int = 0  # before connect: from here on we count ourselves in flight
    t_connected_ns: int | None = None
    t_request_ns: int | None = None  # just before the request bytes were written (TTFT origin)
    t_headers_ns: int | None = None  # arrival of the response status line
    t_first_chunk_ns: int | None = None  # first SSE data event, even the role-only one
    t_first_token_ns: int | None = None  # first event carrying content, reasoning or a tool call
    t_first_content_ns: int | None = None  # first event carrying `content` (answer text)
    t_first_reasoning_ns: int | None = None
    t_last_token_ns: int | None = None
    t_done_ns: int | None = None  # stream closed / fully read
    token_chunk_ns: list[int] = field(default_factory=list)  # arrival of each token event
    chunk_tokens: list[int] | None = None  # tokens per token event, when logprobs were returned
    prompt_tokens: int | None = None  # from usage (stream_options.include_usage)
    completion_tokens: int | None = None
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    n_events: int = 0
    wake_lag_max_ms: float | None = None  # worst recv wake-up delay after kernel arrival
    request_stamp: str | None = None  # "kernel" or "user": where the TTFT origin came from


@dataclass
class Endpoint:
    """Host/port split once, so each request only formats bytes."""

    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme != "http":
            raise ValueError(f"only http:// endpoints are supported, got {url!r}")
        return cls(u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/"))


def build_request(
    ep: Endpoint, path: str, payload: dict[str, Any], api_key: str | None
) -> tuple[bytes, bytes]:
    """(head, body) of an HTTP/1.1 POST with Connection: close (end of stream = server closes).

    Head and body are sent separately: the head's departure stamp is when the request started
    to leave, however long a 128k-token body then takes to stream through the socket.
    """
    body = json.dumps(payload).encode()
    lines = [
        f"POST {ep.base_path}{path} HTTP/1.1",
        f"Host: {ep.host}:{ep.port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), body


# Kernel timestamps (Linux; asm-generic values, the same on x86_64 and aarch64; Python does not
# export the names). SO_TIMESTAMPING gives a software stamp when each received segment arrives
# (ancillary data of recvmsg) and when the request's bytes leave (error queue, read afterwards).
# Older kernels: SO_TIMESTAMPNS (receive only). Neither: user-space stamps.
_LINUX = sys.platform.startswith("linux")
SO_TIMESTAMPNS = 35
SO_TIMESTAMPING = 37
_TS_TX = 1 << 1  # SOF_TIMESTAMPING_TX_SOFTWARE
_TS_FLAGS = _TS_TX | (1 << 3) | (1 << 4) | (1 << 11)  # + RX_SOFTWARE | SOFTWARE | OPT_TSONLY
_ANC = socket.CMSG_SPACE(48)
_ERRQ_ANC = socket.CMSG_SPACE(48) + socket.CMSG_SPACE(64)


def open_connection(url: str, timeout_s: float = 600.0) -> socket.socket:
    """Connected socket with TCP_NODELAY and kernel send/receive timestamps when available.

    Connecting ahead of a wave keeps the server's accept/handler start-up out of TTFT, as a
    client with a warm keep-alive pool would; connect time is reported apart.
    """
    ep = Endpoint.parse(url)
    sock = socket.create_connection((ep.host, ep.port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not _LINUX:
        return sock  # the option numbers below are Linux's
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TS_FLAGS)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # no kernel stamps: user-space stamps are used instead
    return sock


def clock_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, to turn kernel socket stamps into monotonic time.

    Bracketed by two monotonic reads and retried: with 64 threads, a GIL switch between two
    plain reads would put milliseconds of error into every stamp of that request.
    """
    best = None
    for _ in range(tries):
        m1 = time.monotonic_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m2 = time.monotonic_ns()
        if best is None or m2 - m1 < best[0]:
            best = (m2 - m1, r - (m1 + m2) // 2)
        if m2 - m1 < 20_000:
            break
    return best[1]  # type: ignore[index]


_OFFSET: list[int] = []  # [offset_ns, measured_at_monotonic_ns]


def clock_offset_cached(max_age_s: float = 2.0) -> int:
    """The clock offset, re-measured at most every max_age_s (it only drifts by NTP slew, ppm).

    Both stamps of a request use the same offset, so it cancels in TTFT and every gap; only the
    plausibility bounds below need it to be roughly right.
    """
    now = time.monotonic_ns()
    if not _OFFSET or now - _OFFSET[1] > max_age_s * 1e9:
        _OFFSET[:] = [clock_offset_ns(), now]
    return _OFFSET[0]


def _kernel_ns(cdata: bytes) -> int | None:
    """First timespec of a timestamp control message (the software stamp), realtime ns."""
    if len(cdata) < 16:
        return None
    sec, nsec = struct.unpack_from("qq", cdata)
    return sec * 1_000_000_000 + nsec if sec else None


def _tx_stamps(sock: socket.socket, timeout_s: float) -> list[int]:
    """Departure stamp(s) of what was sent so far (realtime ns), then TX stamping off.

    Loopback and NIC software stamps are queued by the time send() returns. TX stamping is
    switched off before the response is read: measured here, leaving it on for the whole stream
    made a stdlib server's small SSE writes arrive in 40 ms bursts.
    """
    out: list[int] = []
    if not _LINUX:
        return out
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TS_FLAGS & ~_TS_TX)
    except OSError:
        return out  # SO_TIMESTAMPING unsupported: SO_TIMESTAMPNS or nothing is in use
    sock.setblocking(False)  # a socket with a timeout would poll() for POLLIN instead
    try:
        while True:
            try:
                _d, anc, _f, _a = sock.recvmsg(64, _ERRQ_ANC, socket.MSG_ERRQUEUE)
            except OSError:  # BlockingIOError when empty
                return out
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                    t = _kernel_ns(cdata)
                    if t is not None:
                        out.append(t)
    finally:
        sock.settimeout(timeout_s)


def stream_request(
    url: str,
    path: str,
    payload: dict[str, Any],
    *,
    timeout_s: float = 600.0,
    api_key: str | None = None,
    tracker: InFlight | None = None,
    sock: socket.socket | None = None,
) -> StreamResult:
    """Send one streaming request and return its raw timings; never raises for HTTP/IO errors.

    `sock` may be a connection opened beforehand with open_connection(); it is consumed.
    The tracker counts this request in flight from before the request is written until after the
    socket is closed, which brackets the server's own view of it (it sees us later and forgets
    us earlier).
    """
    ep = Endpoint.parse(url)
    head, body = build_request(ep, path, payload, api_key)
    res = StreamResult()
    rec = _Recv()
    if tracker is not None:
        tracker.start()
    res.t_start_ns = time.monotonic_ns()
    try:
        if sock is None:
            sock = open_connection(url, timeout_s)
        else:
            sock.settimeout(timeout_s)
        res.t_connected_ns = time.monotonic_ns()
        attach = getattr(tracker, "attach", None)
        if attach is not None:
            attach(sock)  # lets the guard cut a contaminated wave short
        rec.offset_ns = clock_offset_cached()
        res.t_request_ns = t_before = time.monotonic_ns()
        sock.sendall(head)
        t_after = time.monotonic_ns()
        sock.sendall(body)
        # TTFT origin: when the head left, per the kernel (a thread preempted between its own
        # stamp and send() must not count that wait as server time).
        tx = _tx_stamps(sock, timeout_s)
        res.request_stamp = "user"
        if tx:
            k = min(tx) - rec.offset_ns
            # Plausibility bound only (same reasoning as _Recv.stamps).
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
    _parse_response(res, rec.stamps(), rec.bufs)
    return res


class _Recv:
    """The receive loop and its stamps.

    Per recv the loop only keeps (bytes, kernel stamp, user stamp); the kernel stamp is the
    segment's arrival time, so a thread that waited for the GIL after recv() returned does not
    make the event look late. The user stamp is kept to report that wait (wake_lag_max_ms).
    """

    def __init__(self) -> None:
        self.bufs: list[bytes] = []
        self.user: list[int] = []
        self.kern: list[bytes] = []  # raw timespec per recv (b"" if none)
        self.offset_ns = 0  # CLOCK_REALTIME - CLOCK_MONOTONIC, to convert kernel stamps

    def run(self, sock: socket.socket) -> None:
        recvmsg = sock.recvmsg
        now = time.monotonic_ns
        ap_b, ap_u, ap_k = self.bufs.append, self.user.append, self.kern.append
        tail = b""
        while True:
            data, anc, _flags, _addr = recvmsg(262144, _ANC)
            t = now()
            if not data:
                return
            ap_b(data)
            ap_u(t)
            ap_k(anc[-1][2] if anc else b"")
            # Stop on the chunked terminator even if the server keeps the socket open.
            tail = (tail + data)[-7:]
            if tail.endswith(b"\r\n0\r\n\r\n") or tail == b"0\r\n\r\n":
                return

    def stamps(self) -> list[int]:
        """Kernel arrival per recv in monotonic ns (user stamp where the kernel gave none).

        Not clamped to the user stamp: send and receive stamps share one clock offset, which
        cancels in every difference; clamping one side would turn offset noise into error.
        """
        out = []
        for u, k in zip(self.user, self.kern, strict=True):
            kt = _kernel_ns(k)
            ok = kt is not None and -10 * 1_000_000_000 < kt - self.offset_ns - u < 1_000_000_000
            out.append(kt - self.offset_ns if ok else u)  # type: ignore[operator]
        return out

    def max_lag_ms(self) -> float | None:
        st = self.stamps()
        if not st or not any(self.kern):
            return None
        return max(u - k for u, k in zip(self.user, st, strict=True)) / 1e6


def _parse_response(res: StreamResult, stamps: list[int], bufs: list[bytes]) -> None:
    """Post-hoc HTTP + SSE parsing; fills res in place, maps each event to its recv stamp."""
    raw = b"".join(bufs)
    ends: list[int] = []
    total = 0
    for b in bufs:
        total += len(b)
        ends.append(total)

    def stamp_at(raw_off: int) -> int:
        return stamps[min(bisect.bisect_right(ends, raw_off), len(stamps) - 1)]

    hdr_end = raw.find(b"\r\n\r\n")
    if hdr_end < 0:
        if res.error is None:
            res.error = "no HTTP response" if not raw else "truncated HTTP headers"
        return
    res.t_headers_ns = stamps[0]
    head = raw[:hdr_end].decode("latin-1").split("\r\n")
    try:
        res.status = int(head[0].split()[1])
    except (IndexError, ValueError):
        res.error = f"bad status line: {head[0]!r}"
        return
    headers = {}
    for line in head[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    res.request_id = headers.get("x-request-id")
    body, body_to_raw = _dechunk(
        raw, hdr_end + 4, "chunked" in headers.get("transfer-encoding", "")
    )
    if res.status != 200:
        text = body.decode("utf-8", "replace")[:2000]
        res.error = f"HTTP {res.status}: {text}" if res.error is None else res.error
        return
    _parse_sse(res, body, lambda off: stamp_at(body_to_raw(off)))
    if res.error is None and res.t_first_token_ns is None:
        res.error = "stream carried no tokens"
    res.ok = res.error is None


def _dechunk(raw: bytes, start: int, chunked: bool):
    """Return (body, map body offset -> raw offset) for chunked or plain bodies."""
    if not chunked:
        return raw[start:], lambda off: start + off
    parts: list[bytes] = []
    seg_body: list[int] = []  # body offset where each chunk starts
    seg_raw: list[int] = []  # raw offset of the same byte
    pos, body_len = start, 0
    while pos < len(raw):
        nl = raw.find(b"\r\n", pos)
        if nl < 0:
            break
        try:
            size = int(raw[pos:nl].split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        data = raw[nl + 2 : nl + 2 + size]
        seg_body.append(body_len)
        seg_raw.append(nl + 2)
        parts.append(data)
        body_len += len(data)
        pos = nl + 2 + size + 2

    def to_raw(off: int) -> int:
        i = bisect.bisect_right(seg_body, off) - 1
        return seg_raw[i] + (off - seg_body[i]) if i >= 0 else start

    return b"".join(parts), to_raw


def _parse_sse(res: StreamResult, body: bytes, stamp_of) -> None:
    """Walk SSE events; an event's time is the arrival of its terminating blank line."""
    body = body.replace(b"\r\n", b"\n")  # only used by servers that send CRLF events
    pos = 0
    content: list[str] = []
    reasoning: list[str] = []
    counts: list[int] = []
    have_counts = True
    while True:
        end = body.find(b"\n\n", pos)
        if end < 0:
            break
        event = body[pos:end]
        t = stamp_of(end + 1)
        pos = end + 2
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                res.error = f"malformed SSE event: {data[:200]!r}"
                return
            res.n_events += 1
            if res.t_first_chunk_ns is None:
                res.t_first_chunk_ns = t
            if "error" in obj and not obj.get("choices"):
                res.error = f"server error in stream: {json.dumps(obj['error'])[:500]}"
                return
            usage = obj.get("usage")
            if usage:
                res.prompt_tokens = usage.get("prompt_tokens")
                res.completion_tokens = usage.get("completion_tokens")
            for ch in obj.get("choices") or []:
                delta = ch.get("delta")
                if delta is None:  # /v1/completions
                    c_txt, r_txt, tools = ch.get("text") or "", "", None
                else:
                    c_txt = delta.get("content") or ""
                    r_txt = delta.get("reasoning") or delta.get("reasoning_content") or ""
                    tools = delta.get("tool_calls")
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
                if not (c_txt or r_txt or tools):
                    continue
                if res.t_first_token_ns is None:
                    res.t_first_token_ns = t
                if c_txt and res.t_first_content_ns is None:
                    res.t_first_content_ns = t
                if r_txt and res.t_first_reasoning_ns is None:
                    res.t_first_reasoning_ns = t
                res.t_last_token_ns = t
                res.token_chunk_ns.append(t)
                content.append(c_txt)
                reasoning.append(r_txt)
                lp = (ch.get("logprobs") or {}).get("content") if ch.get("logprobs") else None
                if lp is None:
                    have_counts = False
                else:
                    counts.append(len(lp))
    res.content = "".join(content)
    res.reasoning = "".join(reasoning)
    if have_counts and counts:
        res.chunk_tokens = counts
