"""The acceptance probe against a pair's endpoint: its /metrics and chat completions, and
whether the server sends per-request spec-decode metrics (learned from its first reply).

Each prompt is asked as a user turn in DeepSeek-V4's chat mode (``chat_template_kwargs``
``thinking: false``: no reasoning to wait for), greedy, non-streamed, with the probe file's
``max_tokens``; only the reply's ``usage.completion_tokens`` and ``metrics`` are read (the
text is the canary's business).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pairctl.contracts import WATCH_PROBE_TIMEOUT_S
from pairctl.endpoint import Endpoint, cause
from pairctl.sentinel.probe import (
    ERROR,
    FAMILIES,
    Answer,
    Measurement,
    ProbePrompt,
    ProbeSet,
    Skip,
    measure,
    spec_histogram,
)
from pairctl.status.metrics import Scrape, fetch, parse

CHAT_PATH = "/v1/chat/completions"
# One probe reply (256 tokens): ~5 s on a healthy Spark pair, twice that with a broken
# draft, ~15 s on the loaded CPU rehearsal; longer is an ERROR (an event, and the round
# ends there), the same limit as watch's token probe, so a hung engine holds the
# watchdog's tick up at most this long.
PROMPT_TIMEOUT_S = float(WATCH_PROBE_TIMEOUT_S)


@dataclass
class ProbeClient:
    """One endpoint, one model, one probe set; ``session`` a requests.Session with the key."""

    session: Any
    endpoint: Endpoint
    model: str
    probes: ProbeSet
    timeout_s: float = PROMPT_TIMEOUT_S
    # Whether replies carry metrics.speculative_decoding (None until one reply said).
    per_request: bool | None = None

    def metrics(self) -> Scrape:
        """/metrics, the probe's families only (requests' and the parser's errors propagate)."""
        return parse(fetch(self.session, self.endpoint.base, timeout=10), FAMILIES)

    def ask(self, prompt: ProbePrompt) -> Answer | str:
        import requests

        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt.prompt}],
            "temperature": 0.0,
            "max_tokens": self.probes.max_tokens,
            "stream": False,
            "chat_template_kwargs": {"thinking": False},
        }
        target = self.endpoint.url(CHAT_PATH)
        try:
            r = self.session.post(target, json=body, timeout=self.timeout_s)
        except requests.Timeout:
            return f"POST {target}: no reply within {self.timeout_s:g} s"
        except requests.RequestException as exc:
            return f"POST {target}: {cause(exc)}"
        if r.status_code != 200:
            return f"POST {target}: HTTP {r.status_code}: {r.text[:200]}"
        try:
            doc = r.json()
            tokens = int(doc["usage"]["completion_tokens"])
            spec = (doc.get("metrics") or {}).get("speculative_decoding")
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"POST {target}: malformed reply {r.text[:200]!r}"
        return Answer(tokens, spec if isinstance(spec, dict) else None)

    def measure(self, prompt: ProbePrompt) -> Measurement | Skip:
        """One reading of ``prompt``; a /metrics failure is an ERROR skip, not an exception.
        Each reply says whether the server sends per-request metrics (``per_request``)."""
        import requests

        from pairctl.status.metrics import MetricsParseError

        def ask(p: ProbePrompt) -> Answer | str:
            answer = self.ask(p)
            if isinstance(answer, Answer):
                self.per_request = spec_histogram(answer) is not None
            return answer

        try:
            return measure(prompt, self.metrics, ask, self.probes.min_drafts, self.per_request)
        except (requests.RequestException, MetricsParseError) as exc:
            return Skip(prompt.name, ERROR, f"GET {self.endpoint.url('/metrics')}: {exc}"[:300])
