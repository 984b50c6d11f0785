"""TP=N decode on a group of N Sparks (N = 2 or 4), beside the field's TP=4 numbers.

Why: four Sparks as one TP=4 engine halve each rank's weight bytes but pay a 4-way
all-reduce twice per layer. The model starts from its own TP=2 budget (budget.py, the
seed's calibration) and changes only what N changes:

* weight streaming (experts, dense and weight-only GEMMs, lm_heads): per rank x 2/N;
  a replicated share (``replicated_share``: vLLM's ``disable_tp``/``ReplicatedLinear``
  projections in ``vllm/models/deepseek_v4/attention.py`` and ``compressor.py``) does not
  shrink. Default 0: those projections are not sized here, so N=4 is an upper bound.
* all-reduce: 2 per layer (attention ``wo_b``, MoE down), message = tokens x hidden x 2 B.
  Alpha-beta model of NCCL's ring (NVIDIA/nccl ``src/graph/tuning.cc``
  ``ncclTopoTuneModel``): latency = steps x per-hop latency, steps = 2(N-1) for a ring and
  2 log2(N) for a tree; bytes = 2(N-1)/N of the message over each rank's link (NVIDIA/
  nccl-tests ``doc/PERFORMANCE.md``, busbw = algbw x 2(n-1)/n). The per-hop latency is the
  seed's TP=2 all-reduce latency over its 2 steps, so N=2 is today's number exactly.
* fabric: ``switched`` lets NCCL use a tree (any rank reaches any); a switchless ``ring``
  has no links between non-neighbours, so ring only (luxingcom ``docs/01-research-reports/
  analysis-tp2-tp4-communication-2026-08-09.md`` section 5.1; they run ``NCCL_ALGO=RING``).
  Per-direction bandwidth is the same (2 rails) on both.
* misc, the unattributed residual and the spin term do not change with N.
* acceptance does not depend on N: per workload it is read off the peer's own TP=2
  measurement with the model's TP=2 step, so the prediction is TP=2 measured x
  step(2)/step(N) (derived, not fitted to the TP=4 figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfmodel import anchors as A
from perfmodel import budget as B

NODES = (2, 4)
FABRICS = ("switched", "ring")
ALGOS = ("ring", "tree")
BASE_TP = 2  # the seed's calibration point


def allreduce_steps(n: int, algo: str = "ring") -> int:
    """Latency steps of one all-reduce among n ranks (NCCL's tuning model)."""
    if algo == "ring":
        return 2 * (n - 1)
    if algo == "tree":
        return 2 * int(math.log2(n))
    raise ValueError(f"algo must be one of {ALGOS}")


def check_fabric(fabric: str, algo: str) -> None:
    """A tree needs links between non-neighbours: a switchless ring has none."""
    if fabric not in FABRICS:
        raise ValueError(f"fabric must be one of {FABRICS}")
    if fabric == "ring" and algo == "tree":
        raise ValueError(
            "a switchless ring has no links between non-neighbours: use --allreduce ring"
        )


def hop_latency_us(inp: B.Inputs) -> float:
    """Per-step latency: the seed's TP=2 all-reduce latency over its 2 steps."""
    return B.allreduce_latency_us(inp) / allreduce_steps(BASE_TP)


def nccl_ms(inp: B.Inputs, n: int, algo: str = "ring", num_seqs: int = 1) -> float:
    """All-reduce time per verify step at TP=n (equals budget.nccl_ms at n=2)."""
    lat = B.n_allreduce(inp) * allreduce_steps(n, algo) * hop_latency_us(inp) * 1e-3
    # budget.nccl_bytes_ms is one payload per rank, which is 2(N-1)/N at N=2.
    share = 2 * (n - 1) / n
    return lat + B.nccl_bytes_ms(inp, num_seqs) * share


@dataclass(frozen=True)
class GroupStep:
    """One verify step at TP=n, per rank, in ms."""

    n: int
    fabric: str
    algo: str
    weights_ms: float  # experts + heads + dense + weight-only
    nccl_ms: float
    other_ms: float  # misc + residual + spin term

    @property
    def total_ms(self) -> float:
        return self.weights_ms + self.nccl_ms + self.other_ms


_WEIGHTS = ("moe_experts", "draft_verify_heads")
_DENSE = ("dense_fp8_gemms", "weight_only_gemms")


def step(
    inp: B.Inputs,
    n: int,
    fabric: str = "switched",
    algo: str = "ring",
    replicated_share: float = 0.0,
) -> GroupStep:
    """The TP=2 budget with its weight and all-reduce terms moved to TP=n."""
    if n not in NODES:
        raise ValueError(f"nodes must be one of {NODES}")
    check_fabric(fabric, algo)
    if not 0 <= replicated_share <= 1:
        raise ValueError("replicated_share must be in [0, 1]")
    comps = {c.name: c.ms for c in B.components(inp)}
    f = BASE_TP / n
    weights = sum(comps[k] for k in _WEIGHTS) * f
    weights += sum(comps[k] for k in _DENSE) * (replicated_share + (1 - replicated_share) * f)
    other = sum(v for k, v in comps.items() if k not in (*_WEIGHTS, *_DENSE, "nccl"))
    return GroupStep(n, fabric, algo, weights, nccl_ms(inp, n, algo), other)


def versus_peer(
    inp: B.Inputs, n: int, fabric: str, algo: str, replicated_share: float
) -> list[dict]:
    """Per workload: accept length read off the peer's TP=2, the TP=n prediction, the ratio."""
    s2 = step(inp, BASE_TP).total_ms
    sn = step(inp, n, fabric, algo, replicated_share).total_ms
    rows = []
    for w in A.TP4_C1:
        accept_len = w.before * s2 / 1e3
        pred = accept_len * 1e3 / sn
        rows.append(
            {
                "workload": w.what,
                "tp2_measured": w.before,
                "accept_len_from_tp2": round(accept_len, 3),
                "predicted": round(pred, 2),
                "measured": w.after if n == 4 else w.before,
                "ratio": round(pred / (w.after if n == 4 else w.before), 4),
            }
        )
    return rows


def build(
    inp: B.Inputs,
    n: int,
    fabric: str = "switched",
    algo: str = "ring",
    replicated_share: float = 0.0,
) -> dict[str, Any]:
    """The JSON's ``group`` block."""
    g = step(inp, n, fabric, algo, replicated_share)
    base = step(inp, BASE_TP)
    return {
        "nodes": n,
        "fabric": fabric,
        "allreduce": algo,
        "replicated_share": replicated_share,
        "allreduce_steps": allreduce_steps(n, algo),
        "hop_latency_us": round(hop_latency_us(inp), 3),
        "allreduces_per_step": B.n_allreduce(inp),
        "message_bytes": inp.tokens_per_seq() * inp.model.hidden * 2,
        "bytes_share_per_link": round(2 * (n - 1) / n, 4),
        "step_ms": {
            "tp2": round(base.total_ms, 3),
            "tpn": round(g.total_ms, 3),
            "weights_ms": [round(base.weights_ms, 3), round(g.weights_ms, 3)],
            "nccl_ms": [round(base.nccl_ms, 3), round(g.nccl_ms, 3)],
            "other_ms": round(g.other_ms, 3),
        },
        "speedup": round(base.total_ms / g.total_ms, 4),
        "versus_peer": versus_peer(inp, n, fabric, algo, replicated_share),
        "peer": {"setup": A.TP4_C1[0].setup, "source": A.TP4_C1[0].source},
        "cross_check": [m.to_json() for m in A.TP4_NCCL],
    }
