"""vLLM's ``/metrics``: the one parser, and the serving figures, pure and unit-tested.

Every reader of /metrics in the code fetches and parses it here (status, the fleet, the
sentinel, the benches' guard, diffcheck, the twin's tests): ``fetch`` GETs the body with the
caller's session and timeout. ``parse`` turns a body into a ``Scrape`` with prometheus_client's
own text parser; ``family_shapes`` is diffcheck's view of the same text (each family's type
and label names).
Only tests/test_real_pair.py's oracle parses on its own, with prometheus_client directly, so
that it stays independent of this module.
A scrape taken many times a second keeps only the families it needs (``families``): a real
vLLM page is tens of kB of histograms, and a cheap ``startswith`` per line leaves the parser
less Python work under the GIL that the benches' stream threads need.

Figures come from two scrapes ``dt`` seconds apart (rates over that interval), or from one
scrape alone (lifetime averages, and no decode rate). Names, types and labels are vLLM
0.33's, as defined in vllm/v1/metrics/loggers.py (scheduler gauges, token counters, the
TTFT histogram, prefix cache) and vllm/v1/spec_decode/metrics.py (drafts, accepted tokens
per position). The acceptance formulas are the PromQL ones documented on ``SpecDecodingProm``
in that file: per position ``accepted_per_pos / drafts``, mean acceptance length
``1 + accepted / drafts`` (the bonus token included).

``scrape`` is the pair's one GET of /metrics (status, the sentinel, the fleet): it lives
beside the parser so that status and the sentinel both import it from here, not from each
other.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction: "1 means 100 percent usage"
GENERATION = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"

Labels = dict[str, str]


class MetricsParseError(ValueError):
    """The body of /metrics is not Prometheus text exposition."""


@dataclass(frozen=True)
class Scrape:
    """One /metrics body as ``{sample name: [(labels, value), ...]}``."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    def total(self, name: str, **labels: str) -> float | None:
        """Sum over every label set (engines, models) that has ``labels``; None when the name
        is absent (or no row has them)."""
        rows = self.samples.get(name)
        if rows and labels:
            rows = [(lb, v) for lb, v in rows if all(lb.get(k) == w for k, w in labels.items())]
        if not rows:
            return None
        return sum(v for _, v in rows)

    def peak(self, name: str) -> float | None:
        """Largest value over label sets (a usage fraction must not add up across engines)."""
        rows = self.samples.get(name)
        return max(v for _, v in rows) if rows else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum per value of ``label`` (e.g. per draft ``position``)."""
        out: dict[str, float] = defaultdict(float)
        for labels, v in self.samples.get(name, []):
            if label in labels:
                out[labels[label]] += v
        return dict(out)

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """Cumulative histogram buckets ``[(le, count)]`` summed over label sets, by ``le``."""
        per_le = self.by_label(name, "le")
        return sorted((float(le), c) for le, c in per_le.items())


def _keeper(families: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a line (sample, # HELP or # TYPE) belongs to one of ``families``."""

    def keep(line: str) -> bool:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            line = line[7:]
        return line.startswith(families)

    return keep


def fetch(session: Any, base: str, timeout: float) -> str:
    """GET ``base``/metrics and return the body: the one place the project asks a vLLM server
    for its Prometheus page (status, the sentinel, the bench guard, diffcheck). ``session`` is a
    requests.Session (or the requests module); its exceptions propagate for the caller to word.
    """
    r = session.get(f"{base}/metrics", timeout=timeout)
    r.raise_for_status()
    return r.text


def parse(text: str, families: tuple[str, ...] | None = None) -> Scrape:
    """Parse Prometheus text exposition with prometheus_client's parser.

    ``families``: keep only lines whose metric name starts with one of these (a counter's
    family is its name without ``_total``); None parses everything.
    """
    if families is not None:
        keep = _keeper(families)
        text = "\n".join(ln for ln in text.splitlines() if keep(ln)) + "\n"
    samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsParseError(f"not Prometheus text exposition: {exc}") from exc
    return Scrape(dict(samples))


def family_shapes(text: str, prefix: str = "vllm:") -> dict[str, dict[str, Any]]:
    """The families named ``prefix...``: their type and the sorted label-name sets of their
    samples (``le``/``quantile`` left out): what a client's queries depend on, no values."""
    fams: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        labels = sorted(
            {tuple(sorted(k for k in s.labels if k not in ("le", "quantile"))) for s in fam.samples}
        )
        fams[fam.name] = {"type": fam.type, "labels": [list(x) for x in labels]}
    return fams


def increase(before: float | None, after: float | None) -> float | None:
    """Counter increase between two scrapes; a counter that went down was reset (restart),
    so the increase is its new value, as PromQL's ``increase`` treats a reset."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def bucket_increase(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Per-bucket increase of a cumulative histogram between two scrapes."""
    old = dict(before)
    if any(c < old.get(le, 0.0) for le, c in after):  # reset: the new histogram is all new
        return list(after)
    return [(le, c - old.get(le, 0.0)) for le, c in after]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets ``[(le, count)]``, as PromQL estimates it.

    Linear interpolation inside the bucket holding the rank (the first bucket's lower bound
    is 0); a rank in the ``+Inf`` bucket gives the largest finite bound. None when the
    histogram is empty.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not buckets:
        return None
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            in_bucket = count - lower_count
            if in_bucket <= 0:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / in_bucket
        lower_bound, lower_count = le, count
    return lower_bound


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass(frozen=True)
class ServingFigures:
    """What the pair is doing, from /metrics. None = not measurable from what was scraped.

    ``window`` says what the rates and quantiles cover: ``"interval"`` (the last
    ``window_s`` seconds, between two scrapes) or ``"lifetime"`` (since the server started;
    decode tok/s needs an interval and is then None).
    """

    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # fraction 0..1
    decode_tok_s: float | None  # generated tokens per second, all requests
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    prefix_cache_hit_rate: float | None  # hit tokens / queried tokens
    acceptance_per_pos: list[float]  # P(draft k accepted) = accepted_per_pos[k] / drafts
    mean_acceptance_length: float | None  # 1 + accepted / drafts (bonus token included)
    window: str  # "interval" | "lifetime"
    window_s: float | None


def figures(cur: Scrape, prev: Scrape | None = None, dt: float | None = None) -> ServingFigures:
    """Serving figures from ``cur``, as rates over ``dt`` seconds since ``prev`` if given.

    Over an interval in which nothing happened (no drafts, no first tokens, no prefix
    lookups), the ratios fall back to lifetime values rather than showing nothing; the
    decode rate is then a true 0.
    """
    interval = prev is not None and dt is not None and dt > 0

    def change(name: str) -> float | None:
        if not interval:
            return cur.total(name)
        return increase(prev.total(name), cur.total(name))

    def life_or_interval(num: str, den: str) -> tuple[float | None, float | None]:
        n, d = change(num), change(den)
        if interval and (d is None or d <= 0):
            n, d = cur.total(num), cur.total(den)
        return n, d

    decode = None
    if interval:
        gen = change(GENERATION)
        decode = gen / dt if gen is not None else None

    ttft = cur.buckets(TTFT_BUCKET)
    if interval:
        recent = bucket_increase(prev.buckets(TTFT_BUCKET), ttft)
        if recent and recent[-1][1] > 0:
            ttft = recent

    hits, queries = life_or_interval(PREFIX_HITS, PREFIX_QUERIES)
    accepted, drafts = life_or_interval(ACCEPTED, DRAFTS)
    per_pos_now = cur.by_label(ACCEPTED_PER_POS, "position")
    per_pos = per_pos_now
    if interval and drafts is not None and change(DRAFTS):
        old = prev.by_label(ACCEPTED_PER_POS, "position")
        per_pos = {k: increase(old.get(k), v) or 0.0 for k, v in per_pos_now.items()}
    positions = sorted(per_pos, key=int)
    acc_pos = [] if not drafts else [per_pos[k] / drafts for k in positions]
    mal = ratio(accepted, drafts)

    return ServingFigures(
        running=cur.total(RUNNING),
        waiting=cur.total(WAITING),
        kv_cache_usage=cur.peak(KV_USAGE),
        decode_tok_s=decode,
        ttft_p50_s=histogram_quantile(0.5, ttft),
        ttft_p95_s=histogram_quantile(0.95, ttft),
        prefix_cache_hit_rate=ratio(hits, queries),
        acceptance_per_pos=acc_pos,
        mean_acceptance_length=None if mal is None else 1.0 + mal,
        window="interval" if interval else "lifetime",
        window_s=dt if interval else None,
    )


@dataclass(frozen=True)
class MetricsSample:
    """One /metrics scrape and when it was taken (monotonic seconds)."""

    scrape: Scrape
    t: float


def scrape(base: str, timeout: float = 3.0, api_key: str = "") -> tuple[MetricsSample | None, str]:
    """GET /metrics once; (sample, "") or (None, what went wrong). No proxy, the pair's key."""
    import requests  # lazy: only steps that talk HTTP pay for the import

    from pairctl.lifecycle.steps import session  # lazy: the parser alone stays light

    url = f"{base}/metrics"
    try:
        return MetricsSample(parse(fetch(session(api_key), base, timeout)), time.monotonic()), ""
    except requests.RequestException as exc:
        return None, f"GET {url}: {type(exc).__name__}: {exc}"[:300]
    except MetricsParseError as exc:
        return None, f"GET {url}: {exc}"[:300]
