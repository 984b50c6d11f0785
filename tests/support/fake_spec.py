"""A pretend vLLM server's spec-decode counters, for the acceptance probe's pure tests.

It keeps vLLM 0.33's counters as ``SpecDecodingStats.observe_draft`` moves them
(vllm/v1/spec_decode/metrics.py: a verify step that accepted j drafts counts positions
0..j-1) plus ``vllm:generation_tokens`` (1 + j tokens a step) and the running/waiting
gauges, and serves a probe request by drawing its verify steps from the prompt's acceptance
profile; traffic of any shape can be made to run before, during or between probe requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pairctl.sentinel.probe import Answer, ProbePrompt
from pairctl.status.metrics import (
    ACCEPTED_PER_POS,
    DRAFTS,
    GENERATION,
    RUNNING,
    WAITING,
    Scrape,
)

K = 5


def cum(cond: list[float]) -> list[float]:
    """P(position k accepted) from the conditionals (k given k-1)."""
    out, c = [], 1.0
    for p in cond:
        c *= p
        out.append(c)
    return out


def steps(marginals: list[float], n: int, rng: random.Random) -> list[int]:
    """n verify steps: accepted drafts of each (position k accepted iff u < P(k))."""
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(sum(1 for m in marginals if u < m))
    return out


def hist(js: list[int]) -> list[int]:
    h = [0] * (K + 1)
    for j in js:
        h[j] += 1
    return h


@dataclass
class FakeServer:
    """Counters, gauges and a probe endpoint; ``profiles``: prompt name -> marginals."""

    profiles: dict[str, list[float]]
    drafts_per_probe: int = 60
    per_request: bool = False
    seed: int = 0
    drafts: float = 0.0
    per_pos: list[float] = field(default_factory=lambda: [0.0] * K)
    gen: float = 0.0
    running: int = 0
    waiting: int = 0
    during: list[tuple[list[float], int]] = field(default_factory=list)  # traffic in a probe
    lag_scrapes: int = 0  # scrapes after a reply that do not show its last step yet
    asked: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._pending: list[int] = []

    def run(self, js: list[int]) -> None:
        """Count verify steps as vLLM's observe_draft does."""
        for j in js:
            self.drafts += 1
            self.gen += 1 + j
            for k in range(j):
                self.per_pos[k] += 1

    def traffic(self, marginals: list[float], n: int) -> None:
        self.run(steps(marginals, n, self.rng))

    def scrape(self) -> Scrape:
        if self._pending:
            if self.lag_scrapes > 0:
                self.lag_scrapes -= 1
            else:
                self.run(self._pending)
                self._pending = []
        return self._snapshot()

    def _snapshot(self) -> Scrape:
        per = [({"position": str(k), "engine": "0"}, v) for k, v in enumerate(self.per_pos)]
        return Scrape(
            {
                DRAFTS: [({"engine": "0"}, self.drafts)],
                ACCEPTED_PER_POS: per,
                GENERATION: [({"engine": "0"}, self.gen)],
                RUNNING: [({"engine": "0"}, float(self.running))],
                WAITING: [({"engine": "0"}, float(self.waiting))],
            }
        )

    def ask(self, prompt: ProbePrompt) -> Answer:
        """The probe request: its own steps, plus whatever traffic runs meanwhile."""
        self.asked += 1
        mine = steps(self.profiles[prompt.name], self.drafts_per_probe, self.rng)
        for marginals, n in self.during:
            self.traffic(marginals, n)
        self.gen += 1  # the first token comes from the prefill step, not from a verify step
        tokens = 1 + sum(1 + j for j in mine)
        if self.lag_scrapes:
            self.run(mine[:-1])
            self._pending = mine[-1:]
        else:
            self.run(mine)
        spec = {"acceptance_histogram": hist(mine)} if self.per_request else None
        return Answer(tokens, spec)
