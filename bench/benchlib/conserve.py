"""Token conservation: the guard's second line of defence, independent of timing.

Sampling the in-flight gauges misses a foreign request that starts and ends between two samples
(or inside the grace period after our own requests, or just before a wave shorter than the
sampling period). It cannot hide from the counters: between the before- and the after-scrape of
a clean wave, every request the server admitted, finished, prefilled or decoded is counted.
So the counter deltas must equal exactly what our own requests account for. When vLLM 0.33
counts (paths under vllm/):

- `vllm:request_success` (all reasons): when a request finishes, never for a client abort
  (v1/engine/output_processor.py) -> our finished requests;
- `vllm:prompt_tokens`: at the first token, the whole prompt, prefix-cached tokens included
  (v1/metrics/stats.py IterationStats.update_from_output) -> the sum of our usage.prompt_tokens;
- `vllm:generation_tokens`: every token handed out (same place) -> our usage.completion_tokens;
- `vllm:prefix_cache_queries`: once per request at admission, its prompt length
  (v1/core/kv_cache_manager.py record_prefix_cache_stats, v1/core/sched/scheduler.py) -> our
  prompt tokens again; this one also sees a foreign request aborted before its first token;
- `vllm:spec_decode_num_*` and `_per_pos`: per verify step, drafts counted as sampled
  (v1/core/sched/scheduler.py) -> the sum of our responses' per-request acceptance.

The last needs the per-request acceptance vLLM returns with
`--per-request-spec-decode-metrics summary` (`metrics.speculative_decoding` in the usage
chunk). Without it acceptance is only *bounded* by the generation tokens: every verify step
emits 1 + accepted tokens, except that the last step of a request may be cut at max_tokens
after its drafts were counted (up to gamma tokens), so drafts + accepted <= generation - first
tokens + gamma x requests. Any excess over ours marks the attempt contaminated, whatever the
timing; a counter the server does not export, or counts short of ours, cannot be checked and
is reported as such.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.benchlib.response import StreamResult

TOL = 0.5  # counters are floats in the exposition; ours are integers

CONSERVED = "conserved"
BOUNDED = "bounded"


@dataclass
class Ours:
    """What our own requests of one wave account for (from their responses)."""

    requests: int = 0  # finished with usage
    prompt_tokens: int = 0
    completion_tokens: int = 0
    no_usage: int = 0  # sent, but no usage came back (failed or cut short)
    spec_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_per_pos: list[int] = field(default_factory=list)
    spec_missing: int = 0  # finished requests without per-request spec-decode metrics

    @property
    def has_spec(self) -> bool:
        return self.requests > 0 and self.spec_missing == 0


def account(results: Iterable[StreamResult]) -> Ours:
    """Sum the usage (and per-request acceptance, when sent) of our requests of one wave."""
    o = Ours()
    for r in results:
        if r.prompt_tokens is None or r.completion_tokens is None or r.finish_reason is None:
            o.no_usage += 1
            continue
        o.requests += 1
        o.prompt_tokens += r.prompt_tokens
        o.completion_tokens += r.completion_tokens
        spec = r.spec_decode
        if not spec or "acceptance_histogram" not in spec:
            o.spec_missing += 1
            continue
        hist = [int(c) for c in spec["acceptance_histogram"]]
        o.spec_steps += int(spec.get("num_spec_steps", sum(hist)))
        o.spec_draft_tokens += int(spec.get("num_draft_tokens", 0))
        o.spec_accepted += sum(j * c for j, c in enumerate(hist))
        # position k is accepted in every step that accepted more than k drafts
        per_pos = [sum(hist[k + 1 :]) for k in range(len(hist) - 1)]
        if len(o.spec_per_pos) < len(per_pos):
            o.spec_per_pos += [0] * (len(per_pos) - len(o.spec_per_pos))
        for k, v in enumerate(per_pos):
            o.spec_per_pos[k] += v
    return o


@dataclass
class Check:
    """One counter against our own account: equal, excess (foreign), or not checkable."""

    name: str
    server: float | None
    ours: float | None
    verdict: str  # "equal" | "excess" | "within bound" | "unavailable"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v != ""}


@dataclass
class Verdict:
    """All checks of one attempt, and what they say about the figures computed from it."""

    checks: list[Check]
    acceptance: str  # CONSERVED | BOUNDED | "unchecked: <why>"

    @property
    def clean(self) -> bool:
        return not any(c.verdict == "excess" for c in self.checks)

    @property
    def reason(self) -> str | None:
        bad = [c for c in self.checks if c.verdict == "excess"]
        if not bad:
            return None
        parts = [f"{c.name} {c.server:g} > ours {c.ours:g}{c.note}" for c in bad]
        return "conservation: the server counted more than our requests: " + "; ".join(parts)

    @property
    def unchecked(self) -> list[str]:
        return [
            f"{c.name} ({c.note.strip(' ()') or 'not exported'})"
            for c in self.checks
            if c.verdict == "unavailable"
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "acceptance": self.acceptance,
            "checks": [c.to_json() for c in self.checks],
        }


def _equal(name: str, server: float | None, ours: float, why_short: str = "") -> Check:
    if server is None:
        return Check(name, None, ours, "unavailable", " (not exported)")
    if server > ours + TOL:
        return Check(name, server, ours, "excess")
    if server < ours - TOL:
        note = why_short or " (server counted less than our requests: cannot check)"
        return Check(name, server, ours, "unavailable", note)
    return Check(name, server, ours, "equal")


def check(deltas: dict[str, Any], ours: Ours, gamma: int | None) -> Verdict:
    """Compare one attempt's /metrics deltas (promm.delta) with what our requests account for."""
    checks: list[Check] = []
    if ours.no_usage:
        note = f" ({ours.no_usage} request(s) of ours returned no usage)"
        for name in ("requests finished", "prompt tokens", "generation tokens"):
            checks.append(Check(name, None, None, "unavailable", note))
        return Verdict(checks, "unchecked: no usage")
    checks.append(_equal("requests finished", deltas.get("requests_finished"), ours.requests))
    checks.append(_equal("prompt tokens", deltas.get("prompt_tokens"), ours.prompt_tokens))
    checks.append(
        _equal("generation tokens", deltas.get("generation_tokens"), ours.completion_tokens)
    )
    queries = deltas.get("prefix_cache_queries")
    off = " (no lookups counted: prefix caching is off)"
    checks.append(
        _equal("prefix-cache lookups", queries, ours.prompt_tokens, off if queries == 0 else "")
    )
    drafts, accepted = deltas.get("spec_drafts"), deltas.get("spec_accepted_tokens")
    if not drafts:
        return Verdict(checks, "unchecked: no verify steps counted")
    if ours.has_spec:
        checks.append(_equal("verify steps", drafts, ours.spec_steps))
        checks.append(_equal("accepted drafts", accepted, ours.spec_accepted))
        checks.append(
            _equal("draft tokens", deltas.get("spec_draft_tokens"), ours.spec_draft_tokens)
        )
        pos = deltas.get("accepted_per_pos") or []
        for k, v in enumerate(pos):
            mine = ours.spec_per_pos[k] if k < len(ours.spec_per_pos) else 0
            checks.append(_equal(f"accepted at position {k}", v, mine))
        return Verdict(checks, CONSERVED)
    gen = deltas.get("generation_tokens")
    if accepted is None or gen is None or gamma is None:
        return Verdict(checks, "unchecked: spec-decode or generation counters missing")
    # Each verify step emits 1 + accepted; the first token comes from the prefill.
    bound = gen - ours.requests + gamma * ours.requests
    c = Check("verify steps + accepted drafts", drafts + accepted, bound, "within bound")
    if drafts + accepted > bound + TOL:
        c.verdict, c.note = "excess", " (bound: generation - requests + gamma x requests)"
    checks.append(c)
    return Verdict(checks, BOUNDED)


def describe(acceptances: Iterable[str]) -> str:
    """One line for the report: how far the acceptance figures were checked."""
    seen = set(acceptances)
    if not seen:
        return "acceptance: no clean wave"
    if seen == {CONSERVED}:
        return "acceptance: conserved (per-request spec-decode metrics = /metrics deltas)"
    if CONSERVED in seen or BOUNDED in seen:
        return (
            "acceptance: BOUNDED only, not conserved — the server sends no per-request "
            "spec-decode metrics (start vLLM with --per-request-spec-decode-metrics summary)"
        )
    return "acceptance: " + "; ".join(sorted(seen))
