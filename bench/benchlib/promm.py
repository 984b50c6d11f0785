"""The guard's view of vLLM's /metrics: in-flight gauges, counter deltas, DSpark acceptance.

Parsing is pairctl.status.metrics's (the repository's one /metrics parser, prometheus_client's
text parser underneath); the guard scrapes every ~150 ms while streams are being timed, so
it asks for only the families used here. What stays here is bench-specific: a Snapshot of
those families, the deltas over a wave and the acceptance they imply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests

from pairctl.endpoint import Endpoint
from pairctl.status import metrics
from pairctl.status.metrics import RUNNING, WAITING

COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",  # summed over its finished_reason label
)
PER_POS = metrics.ACCEPTED_PER_POS
_FAMILIES = (RUNNING, WAITING, PER_POS.removesuffix("_total")) + tuple(
    c.removesuffix("_total") for c in COUNTERS
)


@dataclass
class Snapshot:
    """One scrape: gauges, counters summed over label sets, accepted tokens per draft position."""

    t_ns: int
    running: float | None = None
    waiting: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)

    @property
    def in_flight(self) -> float | None:
        """running + waiting, or None when the server exports neither gauge."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


def parse(text: str, t_ns: int | None = None) -> Snapshot:
    """Parse Prometheus text exposition into a Snapshot (unknown families are ignored).

    Raises ValueError (metrics.MetricsParseError) when the body is not that format.
    """
    t = time.monotonic_ns() if t_ns is None else t_ns
    scrape = metrics.parse(text, families=_FAMILIES)
    snap = Snapshot(t_ns=t, running=scrape.total(RUNNING), waiting=scrape.total(WAITING))
    for name in COUNTERS:
        value = scrape.total(name)
        if value is not None:
            snap.counters[name] = value
    for pos, value in scrape.by_label(PER_POS, "position").items():
        snap.per_pos[int(pos)] = value
    return snap


def scrape(session: requests.Session, endpoint: Endpoint, timeout_s: float = 5.0) -> Snapshot:
    """GET /metrics of the endpoint and parse it; raises requests exceptions on failure."""
    return parse(metrics.fetch(session, endpoint.base, timeout_s))


def delta(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Counter deltas over a wave + DSpark acceptance derived from them.

    mean_accept_len = 1 + accepted / drafts (tokens emitted per verify step)
    accept_rate_pos[p] = accepted_at_position_p / drafts
    draft_accept_rate = accepted / draft_tokens
    Missing counters give None, never 0.
    """

    def d(name: str) -> float | None:
        if name in before.counters and name in after.counters:
            return after.counters[name] - before.counters[name]
        return None

    out: dict[str, Any] = {
        "prompt_tokens": d("vllm:prompt_tokens_total"),
        "generation_tokens": d("vllm:generation_tokens_total"),
        "spec_drafts": d("vllm:spec_decode_num_drafts_total"),
        "spec_draft_tokens": d("vllm:spec_decode_num_draft_tokens_total"),
        "spec_accepted_tokens": d("vllm:spec_decode_num_accepted_tokens_total"),
        "prefix_cache_queries": d("vllm:prefix_cache_queries_total"),
        "prefix_cache_hits": d("vllm:prefix_cache_hits_total"),
        "requests_finished": d("vllm:request_success_total"),
    }
    drafts, acc, dt = out["spec_drafts"], out["spec_accepted_tokens"], out["spec_draft_tokens"]
    ok = drafts is not None and acc is not None and drafts > 0
    out["mean_accept_len"] = 1.0 + acc / drafts if ok else None
    out["draft_accept_rate"] = acc / dt if acc is not None and dt else None
    per_pos = {
        p: after.per_pos[p] - before.per_pos.get(p, 0.0) for p in sorted(after.per_pos) if p >= 0
    }
    out["accept_rate_pos"] = (
        [per_pos[p] / drafts for p in sorted(per_pos)] if ok and per_pos else None
    )
    out["accepted_per_pos"] = [per_pos[p] for p in sorted(per_pos)] if per_pos else None
    return out


def gamma(snap: Snapshot) -> int | None:
    """Draft positions the server exports (vLLM labels every position 0..gamma-1 at start)."""
    return len([p for p in snap.per_pos if p >= 0]) or None
