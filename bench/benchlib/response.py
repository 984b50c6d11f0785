"""What one streamed request produced, and how its raw bytes become that.

The receive loop keeps only (bytes, stamp) per recv(); everything here runs after the stream has
closed: HTTP status and headers, chunked transfer decoding, then the SSE events of an OpenAI
chat/completions stream, each stamped with the arrival of the recv() that completed it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field


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
    # vLLM's per-request acceptance (`metrics.speculative_decoding` of the usage chunk, sent with
    # --per-request-spec-decode-metrics): lets the guard conserve the spec-decode counters too.
    spec_decode: dict | None = None
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    n_events: int = 0
    wake_lag_max_ms: float | None = None  # worst recv wake-up delay after kernel arrival
    request_stamp: str | None = None  # "kernel" or "user": where the TTFT origin came from


def parse_response(res: StreamResult, stamps: list[int], bufs: list[bytes]) -> None:
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
            metrics = obj.get("metrics")
            if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
                res.spec_decode = metrics["speculative_decoding"]
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
