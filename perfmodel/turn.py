"""Per-turn prefill floor of one chat turn on a Spark pair, next to re-tokenizing the history.

Why: the tokenizer cache's headline (multi-turn TTFT 0.92 s -> 0.47 s, the seed) is only a
halving if the engine's own work per turn is small and does not grow with the history. A turn
prefills only its new tokens (the history is in the prefix cache), in one step that streams
the weights once. This module gives that step's weight-streaming floor with the same
components as the decode budget (budget.py), for M = the turn's new tokens instead of the
gamma + 1 verified tokens: the MoE term pages in almost every expert by a few hundred tokens,
the dense and weight-only GEMMs are read once whatever M. Attention is not in it: with DSA
each new token attends to index_topk (512) selected entries however long the history is;
only the indexer's scores scan the history, and this model has no term for that (nor for
compute: at a few hundred tokens the step is still bandwidth-bound on paper, not measured).

Tokenizing the whole prompt, by contrast, is linear in the history: the offline encode
benchmark (bench/kernels/bench_tokenizer_cache.py) gives its ms per 10k tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.budget import Inputs, distinct_per_layer, moe_ms, nccl_ms


@dataclass(frozen=True)
class TurnFloor:
    """Weight-streaming floor of prefilling `new_tokens` tokens of one conversation."""

    new_tokens: int
    experts_per_layer: float
    moe_ms: float
    dense_ms: float  # dense fp8 + weight-only GEMMs (seed's times, scaled with bandwidth)
    nccl_ms: float
    misc_ms: float

    @property
    def total_ms(self) -> float:
        return self.moe_ms + self.dense_ms + self.nccl_ms + self.misc_ms


def turn_floor(inp: Inputs, new_tokens: int) -> TurnFloor:
    """The floor for one turn of `new_tokens` (uniform routing: prompt tokens are not drafts)."""
    uni = Inputs(inp.model, inp.hw, inp.seed, inp.draft_head_fp8, "uniform", 1)
    scale = inp.seed.bw_gbs / inp.hw.bw_gbs
    return TurnFloor(
        new_tokens,
        distinct_per_layer(uni, 1, new_tokens),
        moe_ms(uni, 1, new_tokens),
        (inp.seed.dense_fp8_ms + inp.seed.weight_only_ms) * scale,
        nccl_ms(inp, 1),
        inp.seed.misc_ms,
    )


def tokenize_ms(history_tokens: int, ms_per_10k: float) -> float:
    """Re-tokenizing the whole prompt: linear in the history."""
    return history_tokens / 10_000 * ms_per_10k
