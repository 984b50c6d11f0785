"""How many distinct routed experts one verify step pages in.

A verify step runs M tokens through every MoE layer; each token picks top-k of E routed
experts. Weight bytes are paid once per *distinct* expert, so the MoE cost of a step is
proportional to the expected size of the union of the M chosen sets, not to M.

For uniform, independent routing a given expert is missed by one token with probability
C(E-1, k) / C(E, k) = (E-k)/E, so the expected union is E * (1 - ((E-k)/E)^M) (linearity of
expectation; exact, no approximation). For DSV4-Flash (E=256, k=6) the base is 250/256.
The seed writes 249/256, i.e. it charges 7 experts per token: at M=1 that is exactly the
6 routed + 1 shared expert, but it keeps re-counting the always-resident shared expert as if
it were a fresh routed pick, so it overstates the union for M > 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_ROUTED = 256
TOP_K = 6
SEED_BASE = 249 / 256  # as written in the seed README


def exact_base(n_experts: int = N_ROUTED, top_k: int = TOP_K) -> float:
    """Probability that one token's top-k misses a given expert: (E-k)/E."""
    return (n_experts - top_k) / n_experts


def distinct_experts(m: float, base: float, n_experts: int = N_ROUTED) -> float:
    """Expected distinct experts after m independent draws that each miss with prob `base`."""
    if m < 0:
        raise ValueError("m must be >= 0")
    return n_experts * (1.0 - base**m)


def distinct_routed_exact(m: float, n_experts: int = N_ROUTED, top_k: int = TOP_K) -> float:
    """Exact expected distinct *routed* experts for m uniform top-k tokens."""
    return distinct_experts(m, exact_base(n_experts, top_k), n_experts)


def distinct_seed(m: float) -> float:
    """The seed's formula 256 * (1 - (249/256)^m)."""
    return distinct_experts(m, SEED_BASE, N_ROUTED)


def effective_tokens(distinct: float, base: float, n_experts: int = N_ROUTED) -> float:
    """Inverse of `distinct_experts`: how many independent tokens would touch `distinct`."""
    if not 0 <= distinct < n_experts:
        raise ValueError("distinct must be in [0, n_experts)")
    return math.log(1.0 - distinct / n_experts) / math.log(base)


@dataclass(frozen=True)
class MonteCarlo:
    """Result of simulating uniform top-k routing: mean and standard error of the union."""

    m: int
    trials: int
    mean: float
    stderr: float


def _sample_topk_sets(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """Uniform k-subsets of range(n), one per row (Floyd's algorithm, vectorised).

    Floyd's algorithm yields every k-subset with equal probability using k draws, which is
    what uniform top-k routing means; argsorting random keys would also do but costs n
    numbers per token.
    """
    chosen = np.empty((rows, k), dtype=np.int64)
    for i, j in enumerate(range(n - k, n)):
        t = rng.integers(0, j + 1, size=rows)
        seen = (chosen[:, :i] == t[:, None]).any(axis=1) if i else np.zeros(rows, bool)
        chosen[:, i] = np.where(seen, j, t)
    return chosen


def monte_carlo_distinct(
    m: int,
    trials: int = 2000,
    n_experts: int = N_ROUTED,
    top_k: int = TOP_K,
    seed: int = 0,
) -> MonteCarlo:
    """Simulate `trials` verify steps of m tokens with uniform independent top-k routing."""
    if m < 1 or trials < 2:
        raise ValueError("need m >= 1 and trials >= 2")
    rng = np.random.default_rng(seed)
    picks = _sample_topk_sets(rng, trials * m, n_experts, top_k).reshape(trials, m * top_k)
    touched = np.zeros((trials, n_experts), dtype=bool)
    touched[np.arange(trials)[:, None], picks] = True
    counts = touched.sum(axis=1).astype(float)
    stderr = float(counts.std(ddof=1) / math.sqrt(trials))
    return MonteCarlo(m, trials, float(counts.mean()), stderr)
