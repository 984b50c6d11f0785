"""Aggregation of raw StreamResult timings into named metrics.

Kept apart from the request function (as vLLM's benchmark does) so the maths can be tested on
synthetic timings. Every formula is documented in bench/README.md; a metric that cannot be computed
is None (JSON null), never 0 — a 0 tok/s would read as a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from bench.benchlib.response import StreamResult

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (b - a) / NS_PER_MS


def request_metrics(r: StreamResult) -> dict[str, Any]:
    """Per-request metrics.

    ttft_ms          = first content/reasoning/tool event - request written (role chunk excluded)
    ttft_content_ms  = first `content` event - request written (answer text, after any reasoning)
    latency_ms       = last token event - request written
    tpot_ms          = (latency - ttft) / (completion_tokens - 1)   [time per output token]
    itl_ms           = gaps between consecutive token events (one event may carry several tokens
                       under speculative decoding, so ITL != TPOT)
    decode_tok_s     = (completion_tokens - 1) / (t_last_token - t_first_token)
    """
    ttft = _ms(r.t_request_ns, r.t_first_token_ns)
    lat = _ms(r.t_request_ns, r.t_last_token_ns)
    n = r.completion_tokens
    tpot = None
    dec = None
    if ttft is not None and lat is not None and n is not None and n > 1 and lat > ttft:
        tpot = (lat - ttft) / (n - 1)
        dec = 1000.0 / tpot
    itl = [
        (b - a) / NS_PER_MS for a, b in zip(r.token_chunk_ns, r.token_chunk_ns[1:], strict=False)
    ]
    return {
        "ok": r.ok,
        "error": r.error,
        "request_id": r.request_id,
        "ttft_ms": ttft,
        "ttft_content_ms": _ms(r.t_request_ns, r.t_first_content_ns),
        "first_chunk_ms": _ms(r.t_request_ns, r.t_first_chunk_ns),
        "connect_ms": _ms(r.t_start_ns, r.t_connected_ns),
        "latency_ms": lat,
        "e2e_ms": _ms(r.t_request_ns, r.t_done_ns),
        "tpot_ms": tpot,
        "decode_tok_s": dec,
        "itl_ms": summarize(itl),
        "itl_max_ms": max(itl) if itl else None,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": n,
        "token_events": len(r.token_chunk_ns),
    }


def chunk_token_counts(r: StreamResult) -> list[float]:
    """Tokens carried by each token event.

    Exact when the server returned logprobs (one entry per token). Otherwise the first event is
    taken as 1 token (the prefill step emits one) and the rest share completion_tokens - 1 evenly:
    speculative decoding packs a variable number of tokens per event, so this is a mean.
    """
    k = len(r.token_chunk_ns)
    if r.chunk_tokens is not None and len(r.chunk_tokens) == k:
        return [float(c) for c in r.chunk_tokens]
    if k == 0 or r.completion_tokens is None:
        return []
    if k == 1:
        return [float(r.completion_tokens)]
    rest = (r.completion_tokens - 1) / (k - 1)
    return [1.0] + [rest] * (k - 1)


def window_rate(
    r: StreamResult, a_ns: int, b_ns: int, min_events: int = 2
) -> tuple[float | None, float]:
    """Decode tok/s of one stream inside [a, b]: (rate, tokens counted).

    Counts between token events, not from the window edges: rate = tokens of events after the
    first in-window event up to the last one / time between those two events. For a periodic
    stream that is unbiased however the window cuts the steps. None if fewer than
    ``min_events`` (>= 2) events fall in the window.
    """
    ts = r.token_chunk_ns
    counts = chunk_token_counts(r)
    idx = [i for i, t in enumerate(ts) if a_ns <= t <= b_ns]
    if len(idx) < max(2, min_events) or not counts:
        return None, 0.0
    i0, i1 = idx[0], idx[-1]
    toks = sum(counts[i0 + 1 : i1 + 1])
    dt = (ts[i1] - ts[i0]) / NS_PER_S
    return (toks / dt if dt > 0 else None), toks


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no data."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(values: Iterable[float | None]) -> dict[str, Any]:
    """n/mean/median/p90/p99/min/max/std over the non-None values; all None if there are none."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return {k: None for k in ("mean", "median", "p90", "p99", "min", "max", "std")} | {"n": 0}
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return {
        "n": len(v),
        "mean": mean,
        "median": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "min": min(v),
        "max": max(v),
        "std": std,
    }


def median(values: Iterable[float | None]) -> float | None:
    return summarize(values)["median"]
