"""The field's decode levers: what this model predicts for each, beside what peers measured.

Three levers peers measured on DeepSeek-V4-Flash DSpark serving (anchors.py):

* the shm queue's spin budget (our overlay ``spin-budget``): calibrated on the peer's A/B,
  since the model has no term for a spinning CPU core taking power from the GPU; what the
  model adds is which readers spin on which node (the queue topology at TP=2);
* regular vs breakable CUDA graphs: calibrated too (launch gaps are not bytes), and the
  model's point is that every stack here already runs regular graphs;
* adaptive verification (vllm-project/vllm#47808): derived. It picks, per step, how many
  drafts to verify by accepted tokens per millisecond; in this bandwidth model every
  verified token pages experts, so the best count per batch size follows from the budget.

``kind`` says which: ``calibrated`` (the peer's figure is the model's input) or
``derived`` (the model's own prediction, the peer's figure only beside it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from perfmodel import anchors as A
from perfmodel import budget as B

ADAPTIVE_BATCHES = (1, 4, 24)
# Readers of a shm MessageQueue at TP=2 with one GPU per node (vllm/v1/executor/
# multiproc_executor.py, vllm/distributed/device_communicators/shm_broadcast.py): on the
# head node the engine core reads its local worker's replies and worker 0 reads the
# scheduler's broadcasts through shared memory (SpinCondition); node 1's worker is a remote
# reader of both and blocks in zmq.
SPINNING_READERS = {"head": 2, "worker": 0}


def _r(x: float, nd: int = 2) -> float:
    return round(x, nd)


def spin_budget(inp: B.Inputs, acc: B.Acceptance, budget_ms: float = 2.0) -> dict[str, Any]:
    base = replace(inp, spin_budget_ms=None)
    with_budget = replace(inp, spin_budget_ms=budget_ms)
    before, after = B.tok_s(base, acc), B.tok_s(with_budget, acc)
    return {
        "lever": f"spin budget {budget_ms:g} ms",
        "flag": f"VLLM_DSV4_SPIN_BUDGET_MS={budget_ms:g} (the plugin's spin-budget overlay)",
        # the fork's 0.21 base has no recheck of an idle reader: the overlay refuses there
        "stacks": ["upstream", "cpu"],
        "kind": "calibrated",
        "model": {
            "tok_s": [_r(before), _r(after)],
            "change": _r(after / before - 1, 6),
            "step_ms": [_r(B.step_ms(base)), _r(B.step_ms(with_budget))],
            "spinning_readers": SPINNING_READERS,
            "note": "tok/s calibrated on the peer's A/B; the readers that spin follow from "
            "the queue topology: up to 2 cores freed on the head node, none on the other",
        },
        "measured": [
            m.to_json()
            for m in (A.SPIN_DECODE, A.SPIN_HEAD_CPU, A.SPIN_WORKER_CPU, A.SPIN_VLLM_CPU)
        ],
    }


def cuda_graphs(inp: B.Inputs, acc: B.Acceptance) -> dict[str, Any]:
    regular = B.tok_s(inp, acc)
    breakable = regular * A.GRAPHS_C1.before / A.GRAPHS_C1.after
    return {
        "lever": "regular CUDA graphs",
        "flag": "VLLM_USE_BREAKABLE_CUDAGRAPH unset or 0: vllm/envs.py's default in 0.22.0, "
        "0.27.1, 0.32 and 0.33 (0.21.0 has no breakable graphs)",
        "stacks": ["fork", "upstream"],  # neither sets it; cpu runs --enforce-eager
        "kind": "calibrated",
        "model": {
            "tok_s": [_r(breakable), _r(regular)],
            "change": _r(regular / breakable - 1, 6),
            "note": "the seed's 67 ms step is regular graphs: an image that turned breakable "
            "graphs on would lose the peer's 22% of throughput; ours do not",
        },
        "measured": [A.GRAPHS_C1.to_json(), A.GRAPHS_C2.to_json()],
    }


def _best_verify(inp: B.Inputs, acc: B.Acceptance, num_seqs: int, per_seq_ms: float) -> dict:
    """Drafts verified per sequence (0..gamma) that maximise tokens per ms at ``num_seqs``."""

    def rate(k: int) -> float:
        verify = replace(inp, model=replace(inp.model, gamma=k))
        accept_len = 1.0 + sum(acc.rates()[:k])
        return num_seqs * accept_len / B.step_ms(verify, num_seqs, per_seq_ms) * 1e3

    gamma = inp.model.gamma
    best = max(range(gamma + 1), key=rate)
    return {
        "num_seqs": num_seqs,
        "fixed_tok_s": _r(rate(gamma)),
        "best_drafts": best,
        "best_tok_s": _r(rate(best)),
        "change": _r(rate(best) / rate(gamma) - 1, 6),
    }


def adaptive_verification(inp: B.Inputs, acc: B.Acceptance, per_seq_ms: float) -> dict[str, Any]:
    rows = [_best_verify(inp, acc, b, per_seq_ms) for b in ADAPTIVE_BATCHES]
    return {
        "lever": "adaptive verification",
        "flag": 'speculative-config "enable_adaptive_verification": true (method dspark)',
        "stacks": [],
        "kind": "derived",
        "model": {
            "gamma": inp.model.gamma,
            "rows": rows,
            "note": "at most the best fixed draft count for this acceptance (one profile "
            "for every sequence): a gain only where acceptance is low, largest at few "
            "sequences; not in any stack here (vLLM >= 0.32; upstream runs 0.27.1, the "
            "rehearsal drafts with ngram, the fork's 0.21 base predates it)",
        },
        "measured": [m.to_json() for m in A.ADAPTIVE],
    }


def build(inp: B.Inputs, acc: B.Acceptance, per_seq_ms: float) -> list[dict[str, Any]]:
    """The three levers at this operating point (the JSON's ``levers``)."""
    return [
        spin_budget(inp, acc),
        cuda_graphs(inp, acc),
        adaptive_verification(inp, acc, per_seq_ms),
    ]
