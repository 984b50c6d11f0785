"""Per-verify-step time budget of single-stream and batched DSpark decode on a Spark pair.

Decode on GB10 is bound by how fast LPDDR5X streams weights, so each component is
`bytes read per rank / (bandwidth x efficiency)` where the bytes can be derived from the
model config, and a calibrated time from the seed where they cannot (see `SEED` and
docs/performance-model.md for which is which).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from perfmodel import anchors, paging


@dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V4-Flash + DSpark, from the public config.json files on Hugging Face.

    `deepseek-ai/DeepSeek-V4-Flash` (layers, hidden, experts, vocab) and
    `deepseek-ai/DeepSeek-V4-Flash-DSpark` (`dspark_block_size` = gamma); MXFP4 bits from the
    OCP Microscaling spec (4-bit E2M1 values + one 8-bit E8M0 scale per 32).
    """

    n_layers: int = 43  # all MoE
    hidden: int = 4096
    moe_intermediate: int = 2048
    n_routed: int = 256
    top_k: int = 6
    vocab: int = 129280
    expert_bits: float = 4.25  # MXFP4: 4-bit values + one 8-bit scale per 32
    head_bytes: int = 2  # lm_head is bf16
    gamma: int = 5  # DSpark block size = num_speculative_tokens
    tp: int = 2

    def expert_bytes_per_rank(self) -> float:
        """gate+up+down of one routed expert, split over TP ranks."""
        params = 3 * self.hidden * self.moe_intermediate
        return params * self.expert_bits / 8 / self.tp

    def head_shard_bytes(self, fp8: bool) -> float:
        """One TP shard of the (shared) lm_head; fp8 adds one fp32 scale per row."""
        rows = self.vocab / self.tp
        if fp8:
            return rows * self.hidden + rows * 4
        return rows * self.hidden * self.head_bytes


@dataclass(frozen=True)
class Hardware:
    """One GB10 per rank and the RoCE link between the two."""

    bw_gbs: float = 235.0  # LPDDR5X, the seed's figure (spec sheet peak 273)
    link_gbps: float = 200.0  # per rail
    rails: int = 2  # one port per card (the seed's 2-rail fix)


@dataclass(frozen=True)
class SeedFigures:
    """Numbers quoted by the seed README, the calibration anchors of the model."""

    bw_gbs: float = 235.0
    moe_ms: float = 30.0
    moe_eff: float = 0.87
    dense_fp8_ms: float = 10.5
    weight_only_ms: float = 7.0
    heads_ms: float = 4.0
    nccl_ms: float = 4.5
    misc_ms: float = 6.0
    total_ms: float = 67.0
    steps_per_s: float = 14.5
    draft_head_bf16_ms: float = 2.73
    draft_head_fp8_ms: float = 1.45
    tok_s_low: float = 45.0
    tok_s_high: float = 65.0
    ceiling_tok_s: float = 131.0  # aggregate at --max-num-seqs 24
    ceiling_num_seqs: int = 24
    ceiling_before_tok_s: float = 108.0  # previous setting not stated in the seed
    tree_ratio: float = 1.85
    gamma: int = 5  # the seed's operating point: chain of gamma drafts, gamma+1 verified
    link_gbps: float = 200.0  # the seed's link: 2 rails of 200G RoCE
    rails: int = 2

    def component_sum_ms(self) -> float:
        return (
            self.moe_ms
            + self.dense_fp8_ms
            + self.weight_only_ms
            + self.heads_ms
            + self.nccl_ms
            + self.misc_ms
        )


SEED = SeedFigures()
# Assumed, not measured: per-position acceptance 0.8 gives mean acceptance length 3.69 and
# ~55 tok/s, the middle of the seed's 45-65 band. Used to turn the seed's aggregate
# ceiling (tok/s) into a step time; the seed does not say what acceptance it saw there.
REF_ALPHA = 0.8
ROUTING_MODES = ("calibrated", "uniform", "seed")
# Share of a step the shm queue readers' 1 s busy-spin costs, calibrated on the one peer A/B
# that measured it on a Spark pair (67.8 -> 74.5 tok/s with a 2 ms budget): the budget takes
# 1 - 67.8/74.5 = 9.0% off the step. The seed's figures were taken with vLLM's 1 s (its fork
# does not change busy_loop_s), so they carry it.
SPIN_SHARE = 1 - anchors.SPIN_DECODE.before / anchors.SPIN_DECODE.after


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance probability per draft position: p_k = P(k ok | 1..k-1 ok)."""

    conditional: tuple[float, ...]

    @classmethod
    def geometric(cls, alpha: float, gamma: int) -> Acceptance:
        return cls(tuple([alpha] * gamma))

    @classmethod
    def from_rates(cls, rates: list[float]) -> Acceptance:
        """From per-position rates a_k = P(first k accepted), as vLLM's
        spec_decode_num_accepted_tokens_per_pos_total / num_drafts gives them."""
        cond, prev = [], 1.0
        for a in rates:
            if not 0 <= a <= prev + 1e-12:
                raise ValueError("per-position rates must be in [0,1] and non-increasing")
            cond.append(a / prev if prev > 0 else 0.0)
            prev = a
        return cls(tuple(cond))

    def __post_init__(self) -> None:
        if not self.conditional or any(not 0 <= p <= 1 for p in self.conditional):
            raise ValueError("acceptance probabilities must be in [0, 1]")

    def rates(self) -> list[float]:
        out, run = [], 1.0
        for p in self.conditional:
            run *= p
            out.append(run)
        return out

    def mean_accepted(self) -> float:
        """E[accepted drafts] = sum_k P(first k accepted)."""
        return sum(self.rates())

    def mean_accept_len(self) -> float:
        """Tokens emitted per verify step: accepted + the bonus/correction token."""
        return 1.0 + self.mean_accepted()


@dataclass(frozen=True)
class Inputs:
    model: ModelConfig = field(default_factory=ModelConfig)
    hw: Hardware = field(default_factory=Hardware)
    seed: SeedFigures = field(default_factory=SeedFigures)
    draft_head_fp8: bool = True
    routing: str = "calibrated"
    tree_width: int = 1
    spin_budget_ms: float | None = None  # None: vLLM's 1 s, as the seed measured

    def tokens_per_seq(self) -> int:
        """Tokens verified per sequence per step: each of w chains re-verifies gamma+1."""
        return self.tree_width * (self.model.gamma + 1)


@dataclass(frozen=True)
class Component:
    name: str
    ms: float
    source: str  # derived | calibrated | residual
    note: str


def _moe_denominator(inp: Inputs) -> float:
    return inp.hw.bw_gbs * 1e9 * inp.seed.moe_eff


def implied_distinct_at_seed(inp: Inputs) -> float:
    """Distinct experts per layer that the seed's 30 ms at 87% of 235 GB/s can have read."""
    m, s = inp.model, inp.seed
    bytes_read = s.moe_ms * 1e-3 * s.bw_gbs * 1e9 * s.moe_eff
    return bytes_read / (m.n_layers * m.expert_bytes_per_rank())


def routing_independence(inp: Inputs) -> float:
    """rho: how independent the routing of one sequence's verified tokens is (1 = uniform).

    Calibrated so that the seed's MoE time holds at gamma=5: the union equals that of
    1 + (M-1)*rho independent tokens. Sequences in a batch are independent of each other.
    """
    m = inp.model
    base = paging.exact_base(m.n_routed, m.top_k)
    m_eff = paging.effective_tokens(implied_distinct_at_seed(inp), base, m.n_routed)
    return (m_eff - 1.0) / inp.seed.gamma


def distinct_per_layer(inp: Inputs, num_seqs: int, tokens_per_seq: int | None = None) -> float:
    """Expected distinct routed experts per layer for one step, under `inp.routing`."""
    m = inp.model
    t = inp.tokens_per_seq() if tokens_per_seq is None else tokens_per_seq
    base = paging.exact_base(m.n_routed, m.top_k)
    if inp.routing == "uniform":
        return paging.distinct_experts(num_seqs * t, base, m.n_routed)
    if inp.routing == "seed":
        return paging.distinct_seed(num_seqs * t)
    if inp.routing == "calibrated":
        rho = routing_independence(inp)
        return paging.distinct_experts(num_seqs * (1 + (t - 1) * rho), base, m.n_routed)
    raise ValueError(f"routing must be one of {ROUTING_MODES}")


def moe_ms(inp: Inputs, num_seqs: int = 1, tokens_per_seq: int | None = None) -> float:
    """MoE expert weight streaming time for one verify step on one rank."""
    d = distinct_per_layer(inp, num_seqs, tokens_per_seq)
    if inp.routing == "seed":
        # The seed's formula is only a shape: anchor it at the seed's own 30 ms for M=6.
        ref = paging.distinct_seed(inp.seed.gamma + 1)
        return inp.seed.moe_ms * d / ref * inp.seed.bw_gbs / inp.hw.bw_gbs
    return inp.model.n_layers * d * inp.model.expert_bytes_per_rank() / _moe_denominator(inp) * 1e3


def head_eff(inp: Inputs, fp8: bool) -> float:
    """Achieved fraction of bandwidth of the lm_head GEMV, from the seed's GB10 timings."""
    s = inp.seed
    t = s.draft_head_fp8_ms if fp8 else s.draft_head_bf16_ms
    return inp.model.head_shard_bytes(fp8) / (t * 1e-3 * s.bw_gbs * 1e9)


def heads_ms(inp: Inputs) -> float:
    """Verify lm_head (bf16) + draft lm_head (fp8 copy or the same bf16 weights)."""

    def t(fp8: bool) -> float:
        b = inp.model.head_shard_bytes(fp8)
        return b / (inp.hw.bw_gbs * 1e9 * head_eff(inp, fp8)) * 1e3

    return t(False) + t(inp.draft_head_fp8)


def n_allreduce(inp: Inputs) -> int:
    """Two row-parallel outputs per layer (attention o-proj, MoE down) are all-reduced."""
    return 2 * inp.model.n_layers


def nccl_bytes_ms(inp: Inputs, num_seqs: int) -> float:
    """Bandwidth term of the all-reduces: 2-rank ring moves each payload once per rank."""
    tokens = num_seqs * inp.tokens_per_seq()
    payload = tokens * inp.model.hidden * 2
    link = inp.hw.rails * inp.hw.link_gbps / 8 * 1e9
    return n_allreduce(inp) * payload / link * 1e3


def allreduce_latency_us(inp: Inputs) -> float:
    """Per-all-reduce latency implied by the seed's NCCL time (at its single-stream M=6)."""
    s = inp.seed
    ref = replace(
        inp,
        tree_width=1,
        model=replace(inp.model, gamma=s.gamma),
        hw=replace(inp.hw, link_gbps=s.link_gbps, rails=s.rails),
    )
    return (inp.seed.nccl_ms - nccl_bytes_ms(ref, 1)) / n_allreduce(inp) * 1e3


def nccl_ms(inp: Inputs, num_seqs: int = 1) -> float:
    return n_allreduce(inp) * allreduce_latency_us(inp) * 1e-3 + nccl_bytes_ms(inp, num_seqs)


def residual_ms(inp: Inputs) -> float:
    """What the seed's total has that its listed components do not (67 - 62 ms)."""
    return inp.seed.total_ms - inp.seed.component_sum_ms()


def components(inp: Inputs, num_seqs: int = 1) -> list[Component]:
    """The per-verify-step budget for `num_seqs` sequences decoding together."""
    s, scale = inp.seed, inp.seed.bw_gbs / inp.hw.bw_gbs
    d = distinct_per_layer(inp, num_seqs)
    moe_note = {
        "uniform": "bytes/BW, uniform independent top-6 routing",
        "calibrated": "bytes/BW, routing locality rho fitted to the seed's 30 ms",
        "seed": "seed's 30 ms scaled by the seed's 249/256 union formula",
    }[inp.routing]
    out = [
        Component(
            "moe_experts",
            moe_ms(inp, num_seqs),
            "derived" if inp.routing == "uniform" else "calibrated",
            f"{moe_note}: {d:.1f} experts/layer x {inp.model.n_layers} layers x "
            f"{inp.model.expert_bytes_per_rank() / 1e6:.2f} MB/rank, "
            f"{s.moe_eff:.0%} of BW",
        ),
        Component(
            "dense_fp8_gemms",
            s.dense_fp8_ms * scale,
            "calibrated",
            "seed's time, scaled with bandwidth",
        ),
        Component(
            "weight_only_gemms",
            s.weight_only_ms * scale,
            "calibrated",
            "seed's time, scaled with bandwidth",
        ),
        Component(
            "draft_verify_heads",
            heads_ms(inp),
            "derived",
            "lm_head shard bytes/BW (efficiency from the seed's GEMM ms); draft head "
            + ("fp8" if inp.draft_head_fp8 else "bf16"),
        ),
        Component(
            "nccl",
            nccl_ms(inp, num_seqs),
            "derived",
            f"{n_allreduce(inp)} all-reduces x {allreduce_latency_us(inp):.0f} us "
            "(latency calibrated) + bytes over the RoCE rails",
        ),
        Component("misc", s.misc_ms, "calibrated", "launches, sampling, scheduling"),
        Component(
            "unattributed",
            residual_ms(inp),
            "residual",
            "seed total 67 ms minus its listed components (62 ms)",
        ),
    ]
    saving = spin_saving_ms(inp, sum(c.ms for c in out))
    if saving:
        out.append(
            Component(
                "spin_budget",
                -saving,
                "calibrated",
                f"queue readers sleep {inp.spin_budget_ms:g} ms after a message instead of "
                f"spinning 1 s: -{SPIN_SHARE:.1%} of the step (peer: 67.8 -> 74.5 tok/s)",
            )
        )
    return out


def spin_saving_ms(inp: Inputs, step: float) -> float:
    """What the spin budget takes off a step of ``step`` ms (0 without one).

    A reader parks only when the gap to its next message outlasts the budget: the engine
    core waits a whole forward for its worker's reply, so any budget shorter than the step
    parks it every step; vLLM's own 1 s never does. The saving is the peer's share of the
    step, at any batch (the peer measured one stream).
    """
    if inp.spin_budget_ms is None or inp.spin_budget_ms >= step:
        return 0.0
    return step * SPIN_SHARE


def step_ms(inp: Inputs, num_seqs: int = 1, per_seq_ms: float = 0.0) -> float:
    """Verify-step time; `per_seq_ms` charges each sequence beyond the first."""
    return sum(c.ms for c in components(inp, num_seqs)) + per_seq_ms * (num_seqs - 1)


def steps_per_s(inp: Inputs) -> float:
    return 1e3 / step_ms(inp)


def tok_s(inp: Inputs, acc: Acceptance) -> float:
    """Single-stream decode tok/s = steps/s x (accepted + 1)."""
    return steps_per_s(inp) * acc.mean_accept_len()


def calibrated_per_seq_ms(inp: Inputs) -> float:
    """Per-extra-sequence cost that makes the seed's aggregate ceiling hold.

    Only the seed's own operating point is used (235 GB/s, gamma 5, chain), so the cost is
    a property of the engine, not of the flags being explored. It lumps together whatever
    grows with the batch besides expert paging and all-reduce bytes (attention over each
    sequence's KV cache, sampling, scheduling); the seed gives no breakdown of it.
    """
    s = inp.seed
    ref = replace(
        inp,
        hw=Hardware(s.bw_gbs, s.link_gbps, s.rails),
        tree_width=1,
        model=replace(inp.model, gamma=s.gamma),
        spin_budget_ms=None,  # the seed's ceiling was measured with vLLM's 1 s spin
    )
    acc = Acceptance.geometric(REF_ALPHA, s.gamma)
    b = s.ceiling_num_seqs
    target = b * acc.mean_accept_len() / s.ceiling_tok_s * 1e3
    return (target - step_ms(ref, b)) / (b - 1)


def aggregate_tok_s(inp: Inputs, acc: Acceptance, num_seqs: int, per_seq_ms: float) -> float:
    return num_seqs * acc.mean_accept_len() / step_ms(inp, num_seqs, per_seq_ms) * 1e3


def alpha_for_tok_s(inp: Inputs, target: float) -> float | None:
    """Constant per-position acceptance that yields `target` single-stream tok/s."""
    sps = steps_per_s(inp)
    lo, hi = 0.0, 1.0
    if not sps <= target <= sps * (inp.model.gamma + 1):
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if sps * Acceptance.geometric(mid, inp.model.gamma).mean_accept_len() < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def as_dict(inp: Inputs) -> dict:
    return asdict(inp)
