"""Prometheus metrics under vLLM 0.33's names, produced with prometheus_client.

Names, types and labels as vllm/v1/metrics/loggers.py (scheduler, tokens, latency
histograms) and vllm/v1/spec_decode/metrics.py (drafts, accepted tokens per position)
define them.

Labels as vLLM sets them: `model_name` and `engine="0"`; the per-position acceptance
counter adds `position`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Metrics:
    """All engine metrics, bound to one model name."""

    def __init__(self, model_name: str, gamma: int) -> None:
        self.registry = reg = CollectorRegistry()
        lbl = ["model_name", "engine"]
        self._lv = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lbl, registry=reg).labels(**self._lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lbl, registry=reg).labels(**self._lv)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, lbl, buckets=buckets, registry=reg).labels(**self._lv)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.requests_success = Counter(
            "vllm:request_success", "Finished requests.", lbl + ["finished_reason"], registry=reg
        )
        # Every reason exported from the start at 0, as vLLM labels them at start-up
        # (vllm/v1/metrics/loggers.py: `for reason in FinishReason`; the strings are
        # FINISH_REASON_STRINGS in vllm/v1/engine/__init__.py).
        for reason in FINISH_REASONS:
            self.requests_success.labels(finished_reason=reason, **self._lv)
        self.drafts = counter("vllm:spec_decode_num_drafts", "Verify steps (drafts).")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Accepted drafts.")
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens per position.",
            lbl + ["position"],
            registry=reg,
        )
        self.accepted_pos = [per_pos.labels(position=str(k), **self._lv) for k in range(gamma)]
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Request receipt (before tokenization) to first token.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Gap between a request's consecutive engine outputs.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Request receipt to finish.", E2E_BUCKETS
        )

    def finished(self, reason: str) -> None:
        self.requests_success.labels(finished_reason=reason, **self._lv).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
