"""A broken draft's acceptance, as the twin models it: each fault maps a request's healthy
acceptance per draft position to the broken draft's, while the target model, and so the
output text, stays the same (the text never depends on acceptance in vLLM: rejection
sampling keeps the target's tokens, vllm/v1/sample/rejection_sampler.py).

The signatures are the ones reported from the field for DeepSeek-V4-Flash + DSpark:

- ``draft-decay:FACTOR[:FROM]``: the conditional acceptance of positions FROM (0-based,
  default 1) and later times FACTOR: a draft whose later positions lost what they need.
- ``draft-weights-dropped``: the draft's shared-expert tensors silently not loaded ("Patch 4"
  of tonyd2wild/DeepSeek-v4-Flash-0731-DSpark-1M-NVFP4-KV-2x-DGX-Spark; eugr/spark-vllm-docker
  #331): decode halves with the output unchanged, the draft acceptance rate falls from 60%
  to 26%. At K = 5 draft positions a rate of 60% is every conditional at ~0.83
  ((0.83 + 0.83^2 + ... + 0.83^5) / 5 = 0.60) and 26% is every conditional at ~0.58, so the
  fault multiplies every position's conditional by ``WEIGHTS_DROPPED_FACTOR`` = 0.70.
- ``draft-grammar``: a tool-call grammar that rejects the drafts: with DSML's tool-call
  grammar on, DSpark's per-position acceptance fell to .914/.224/0/0/0
  (ecohash-co/deepseek-v4-flash-dgx-spark-vllm027 README). Each position's acceptance is
  capped at that profile (positions past the fifth at 0).
- ``draft-first-collapse[:P]``: the first draft position is accepted with probability at
  most P (default 0.05), and every later one with it: a draft that is fed the wrong inputs
  (the fork's DSpark without the per-request "Keys" patch at max_num_seqs > 1,
  MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark docs/PATCHES.md, collapses acceptance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WEIGHTS_DROPPED_FACTOR = 0.70
GRAMMAR_PROFILE = (0.914, 0.224, 0.0, 0.0, 0.0)
FIRST_COLLAPSE_P = 0.05
KINDS = ("draft-decay", "draft-weights-dropped", "draft-grammar", "draft-first-collapse")


@dataclass(frozen=True)
class DraftFault:
    """One draft fault; ``apply`` takes and returns conditional acceptances per position."""

    kind: str
    factor: float = 1.0  # draft-decay's FACTOR, draft-first-collapse's P
    start: int = 1  # draft-decay's FROM

    def apply(self, cond: list[float]) -> list[float]:
        if self.kind == "draft-decay":
            return [p * self.factor if k >= self.start else p for k, p in enumerate(cond)]
        if self.kind == "draft-weights-dropped":
            return [p * WEIGHTS_DROPPED_FACTOR for p in cond]
        if self.kind == "draft-first-collapse":
            return [min(p, self.factor) if k == 0 else p for k, p in enumerate(cond)]
        if self.kind == "draft-grammar":
            return capped(cond, GRAMMAR_PROFILE)
        raise ValueError(f"unknown draft fault {self.kind!r}")


def capped(cond: list[float], cap: tuple[float, ...]) -> list[float]:
    """Conditionals whose marginals (P(position k accepted)) are at most ``cap``'s."""
    out: list[float] = []
    healthy = broken = 1.0
    for k, p in enumerate(cond):
        healthy *= p
        limit = cap[k] if k < len(cap) else 0.0
        target = min(healthy, limit)
        out.append(target / broken if broken > 0 else 0.0)
        broken = target
    return out


def parse_item(kind: str, args: list[str], num: Callable[[str, str], float]) -> DraftFault:
    """One draft fault from its spec fields (``num(text, what)`` parses a number >= 0, as
    sim/twin/faults.py words its errors); ValueError when the fields do not fit the kind."""
    if kind == "draft-decay" and len(args) in (1, 2):
        factor = num(args[0], "FACTOR")
        if factor > 1:
            raise ValueError("FACTOR must be in [0, 1]")
        return DraftFault(kind, factor, int(num(args[1], "FROM")) if len(args) == 2 else 1)
    if kind in ("draft-weights-dropped", "draft-grammar") and not args:
        return DraftFault(kind)
    if kind == "draft-first-collapse" and len(args) <= 1:
        p = num(args[0], "P") if args else FIRST_COLLAPSE_P
        if p > 1:
            raise ValueError("P must be in [0, 1]")
        return DraftFault(kind, p)
    raise ValueError("wrong number of fields")
