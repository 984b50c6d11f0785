"""Which per-position acceptance a request's drafts follow: content rules and the draft fault.

Real DSpark acceptance depends on how predictable the text is (code well above prose); a
profile may say so with ``spec_decode.accept_by_content``: a list of ``{match: REGEX,
accept_prob_by_pos: [...]}``, the first rule whose regex is found in the request's last
user message (or completion prompt) gives its conditional acceptances, and a request no
rule matches gets the profile's ``accept_prob_by_pos``. The draft faults
(sim/twin/draft_faults.py: ``draft-decay``, ``draft-weights-dropped``, ``draft-grammar``,
``draft-first-collapse``) turn every request's conditionals into a broken draft's, while
the target model, and so the output text, is unchanged. The counters then move as vLLM's do
(vllm/v1/spec_decode/metrics.py: ``observe_draft`` counts position i for each draft that
accepted more than i tokens), because the engine draws from these marginals.
"""

from __future__ import annotations

import re
from typing import Any

from sim.twin.draft_faults import DraftFault
from sim.twin.profile import Profile, ProfileError


def _padded(probs: list[float], gamma: int) -> list[float]:
    """Conditionals for positions 0..gamma-1, the last entry reused (as Profile.probs)."""
    return [probs[min(k, len(probs) - 1)] for k in range(gamma)]


def _cum(cond: list[float]) -> list[float]:
    out, c = [], 1.0
    for p in cond:
        c *= p
        out.append(c)
    return out


class AcceptanceModel:
    """The marginal acceptance per position (what ``AcceptanceDrawer`` takes) of a request."""

    def __init__(self, prof: Profile, gamma: int, faults: list[DraftFault] | None = None) -> None:
        self.gamma, self.faults = gamma, list(faults or [])
        self.default = self._apply(prof.probs(gamma))
        self.rules: list[tuple[re.Pattern[str], list[float]]] = []
        for i, rule in enumerate(prof.section("spec_decode").get("accept_by_content") or []):
            try:
                probs = [float(x) for x in rule["accept_prob_by_pos"]]
                pattern = re.compile(str(rule["match"]))
            except (KeyError, TypeError, ValueError, re.error) as exc:
                raise ProfileError(f"spec_decode.accept_by_content[{i}]: {exc}") from exc
            if not probs or not all(0.0 <= p <= 1.0 for p in probs):
                raise ProfileError(f"spec_decode.accept_by_content[{i}]: probabilities in [0, 1]")
            self.rules.append((pattern, self._apply(_padded(probs, gamma))))

    def _apply(self, cond: list[float]) -> list[float]:
        for fault in self.faults:
            cond = fault.apply(cond)
        return _cum(cond)

    def cum_for(self, text: str | None) -> list[float]:
        if text:
            for pattern, cum in self.rules:
                if pattern.search(text):
                    return cum
        return self.default


def request_text(body: dict[str, Any], chat: bool) -> str | None:
    """The text content rules look at: the last user message, or the completion prompt."""
    if not chat:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else None
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return None
    for m in reversed(msgs):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else None
    return None
