"""Which pair served a request that came through the router, read off the pairs' own counters.

The simulator says it in a header (`X-Spark-Pair`, harness-only, sim/twin); real vLLM sends
no such thing, and the router (vllm-router 0.1.17) does not name the worker in its reply
either. What every vLLM does expose is `vllm:request_success_total`, which its engine adds to
once per finished request (vllm/v1/metrics/loggers.py, PrometheusStatLogger
`counter_request_success`, labels finished_reason/model_name/engine). So for one request at a
time: read both heads' counters, send the request, and the pair whose count went up by one
served it. The router's own health probes hit `/health` and `/v1/models` and finish no
request, so they do not move the count. Concurrent requests cannot be told apart this way;
the failover (sim/rehearsal/failover.py) attributes those by the session's home pair before
the kill and by the counters of the one pair left alive after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from pairctl.status import metrics

METRIC = "vllm:request_success_total"
T = TypeVar("T")


def finished(text: str) -> float:
    """The sum of `vllm:request_success_total` over its labels in a /metrics body."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == METRIC
    )


class Counters:
    """The finished-request counts of each pair's head, by pair id."""

    def __init__(self, endpoints: dict[str, str], timeout: float = 5.0) -> None:
        self.endpoints = endpoints
        self.timeout = timeout

    def read(self) -> dict[str, float | None]:
        """Each pair's count now; None where its head does not answer (a dead pair)."""
        out: dict[str, float | None] = {}
        for pair, url in self.endpoints.items():
            try:
                out[pair] = finished(metrics.fetch(requests, url, self.timeout))
            except (requests.RequestException, ValueError):
                out[pair] = None
        return out

    def grew(self, before: dict[str, float | None], after: dict[str, float | None]) -> list[str]:
        return [
            p for p in self.endpoints if (after.get(p) or 0) > (before.get(p) or 0) and after[p]
        ]

    def served(self, send: Callable[[], T], settle_s: float = 5.0) -> tuple[T, str | None]:
        """Run ``send`` (one request, nothing else in flight) and name the pair that finished
        it: the one whose count grew by exactly one. The engine counts a request when its
        output loop records stats, after it has queued the request's last output
        (vllm/v1/engine/async_llm.py output_handler, step 4 after step 2), so the client can
        read [DONE] first: the counters are read again for up to ``settle_s``. None: no
        pair, or not exactly one."""
        before = self.read()
        result = send()
        deadline = time.monotonic() + settle_s
        while True:
            after = self.read()
            grown = self.grew(before, after)
            if grown or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if len(grown) == 1 and (after[grown[0]] or 0) - (before.get(grown[0]) or 0) == 1:
            return result, grown[0]
        return result, None
