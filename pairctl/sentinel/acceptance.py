"""The acceptance sentinel's core: two counter snapshots + a baseline in, one judgement out.

Pure functions only (no HTTP, no clock), so every rule is unit-tested.

Counters are vLLM 0.33's spec-decode counters (vllm/v1/spec_decode/metrics.py,
``SpecDecodingProm``): ``vllm:spec_decode_num_drafts`` (verify steps), ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` (label ``position``, 0-based).
``SpecDecodingStats.observe_draft`` counts position ``i`` for every draft that accepted more
than ``i`` tokens, so ``A_k`` (accepted at position k) is the number of drafts whose first
``k+1`` tokens were all accepted, and ``A_k <= A_(k-1)``.

The statistic (docs/INTERFACES.md "Acceptance sentinel" says the same for operators):

    a0 = A_0 / drafts                                  first-position acceptance
    c  = (A_1 + ... + A_(K-1)) / (A_0 + ... + A_(K-2)) pooled conditional acceptance of the
                                                       later positions (k given k-1)
    depth ratio R = c / a0

Traffic mix moves how predictable the text is, which scales every position's conditional
acceptance together: for a draft that is as good at depth k as at depth 0 (conditionals all
alpha), ``R = 1`` whatever alpha is (prose, code, agent loops). A window mixing requests of
different alpha has ``R >= 1`` (E[alpha^(k+1)] >= E[alpha] E[alpha^k], Chebyshev's
association inequality), so a mix change cannot pull R down below what each kind of
traffic has alone. A draft that lost the weights its later positions depend on (the
"dropped shared-expert weights" failure: per position 81/62/46/33/24% -> 60/20/8/3/1%)
collapses ``c`` far more than ``a0``: R falls from 0.92 to 0.59 there. The sentinel fires
when R falls below the recorded band's floor; a second rule catches a draft that collapsed
everywhere at once (``a0`` below its own floor). The mean acceptance length is reported
against its recorded range, but leaving that range alone is a traffic note, not an alarm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pairctl.status.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFTS, Scrape

DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DEFAULT_MIN_DRAFTS = 1000  # below this many drafts in the window: no judgement
DEFAULT_MIN_TRIALS = 200  # and at least this many continuation attempts (A_0 + .. + A_(K-2))

OK, DROP = "ok", "drop"
INSUFFICIENT, NO_BASELINE, NO_SPEC, MISMATCH = "insufficient", "no-baseline", "no-spec", "mismatch"


@dataclass(frozen=True)
class Counters:
    """The four spec-decode counters at one moment (summed over engines)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]  # A_0 .. A_(K-1)

    def reset_since(self, older: Counters) -> bool:
        """A counter went down (or the positions changed): the server restarted between."""
        return (
            self.drafts < older.drafts
            or self.accepted < older.accepted
            or len(self.per_pos) != len(older.per_pos)
            or any(a < b for a, b in zip(self.per_pos, older.per_pos, strict=True))
        )

    def minus(self, older: Counters) -> Counters:
        """Increase since ``older``; after a reset the whole of this snapshot is the increase
        (PromQL's ``increase`` does the same)."""
        if self.reset_since(older):
            return self
        return Counters(
            self.drafts - older.drafts,
            self.draft_tokens - older.draft_tokens,
            self.accepted - older.accepted,
            tuple(a - b for a, b in zip(self.per_pos, older.per_pos, strict=True)),
        )


def counters_of(scrape: Scrape) -> Counters | None:
    """The spec-decode counters of one /metrics scrape; None when the server has none (no
    speculative decoding configured)."""
    drafts = scrape.total(DRAFTS)
    if drafts is None:
        return None
    per = scrape.by_label(ACCEPTED_PER_POS, "position")
    return Counters(
        drafts=drafts,
        draft_tokens=scrape.total(DRAFT_TOKENS) or 0.0,
        accepted=scrape.total(ACCEPTED) or 0.0,
        per_pos=tuple(per[k] for k in sorted(per, key=int)),
    )


@dataclass(frozen=True)
class Shape:
    """Acceptance figures of one window of counters."""

    drafts: float
    per_pos: list[float]  # P(position k accepted) = A_k / drafts
    conditional: list[float | None]  # k=0: A_0/drafts; k>=1: A_k / A_(k-1)
    mean_length: float | None  # 1 + accepted / drafts (the bonus token included)
    first: float | None  # a0
    later: float | None  # c, the pooled conditional acceptance of positions 1..K-1
    depth_ratio: float | None  # R = c / a0
    trials: float  # A_0 + ... + A_(K-2): how many times a later position was tried


def _div(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def shape(c: Counters) -> Shape:
    """The sentinel's figures of a window (see the module docstring for the formulas)."""
    a = c.per_pos
    first = _div(a[0], c.drafts) if a else None
    cond: list[float | None] = [first] + [_div(a[k], a[k - 1]) for k in range(1, len(a))]
    trials = sum(a[:-1])
    later = _div(sum(a[1:]), trials)
    ratio = later / first if later is not None and first else None
    mal = _div(c.accepted, c.drafts)
    return Shape(
        drafts=c.drafts,
        per_pos=[x / c.drafts if c.drafts > 0 else 0.0 for x in a],
        conditional=cond,
        mean_length=None if mal is None else 1.0 + mal,
        first=first,
        later=later,
        depth_ratio=ratio,
        trials=trials,
    )


@dataclass(frozen=True)
class Band:
    """What a healthy pair of this recipe showed, and the floors the sentinel judges by."""

    positions: int  # K, the recipe's num_speculative_tokens
    depth_ratio_floor: float  # fire below this R
    first_floor: float  # fire below this a0 (a draft collapsed at every position)
    conditional_floor: list[float]  # per position: named as collapsed below this
    mean_length_range: tuple[float, float]  # recorded min, max (a traffic note outside it)
    min_drafts: int = DEFAULT_MIN_DRAFTS
    min_trials: int = DEFAULT_MIN_TRIALS


@dataclass(frozen=True)
class Reading:
    """One judgement; ``state`` is ``ok``, ``drop`` (the event), or why there is none."""

    state: str  # ok | drop | insufficient | no-baseline | no-spec | mismatch
    detail: str  # one line for a human
    window: str  # what the counters cover, e.g. "last 600 s" or "since start"
    drafts: float
    per_pos: list[float] = field(default_factory=list)
    conditional: list[float | None] = field(default_factory=list)
    mean_length: float | None = None
    depth_ratio: float | None = None
    first: float | None = None
    collapsed: list[int] = field(default_factory=list)  # positions below conditional_floor
    note: str = ""  # a traffic note (mean length outside the recorded range, shape intact)
    band: dict[str, Any] | None = None

    @property
    def event(self) -> bool:
        return self.state == DROP

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(xs: list[float]) -> str:
    return "/".join(f"{100 * x:.0f}" for x in xs) + "%"


def judge(
    before: Counters | None, after: Counters | None, band: Band | None, window: str
) -> Reading:
    """Judge the counters between ``before`` and ``after`` (``before`` None: since start)."""
    if after is None:
        return Reading(NO_SPEC, "no spec-decode counters on /metrics", window, 0.0)
    c = after.minus(before) if before is not None else after
    s = shape(c)
    base = {
        "window": window,
        "drafts": c.drafts,
        "per_pos": s.per_pos,
        "conditional": s.conditional,
        "mean_length": s.mean_length,
        "depth_ratio": s.depth_ratio,
        "first": s.first,
    }
    if band is None:
        return Reading(NO_BASELINE, "no recorded baseline band for this recipe", **base)
    base["band"] = asdict(band)
    if len(c.per_pos) != band.positions:
        return Reading(
            MISMATCH,
            f"the pair drafts {len(c.per_pos)} positions, the baseline was recorded with "
            f"{band.positions}: record it again for this recipe",
            **base,
        )
    if c.drafts < band.min_drafts or s.trials < band.min_trials:
        return Reading(
            INSUFFICIENT,
            f"{c.drafts:.0f} drafts ({s.trials:.0f} later-position tries) in the window; "
            f"judged from {band.min_drafts} ({band.min_trials})",
            **base,
        )
    collapsed = [
        k
        for k in range(1, band.positions)
        if (x := s.conditional[k]) is not None and x < band.conditional_floor[k]
    ]
    lo, hi = band.mean_length_range
    note = ""
    mal = s.mean_length or 0.0
    if mal < lo or mal > hi:
        note = (
            f"mean acceptance length {mal:.2f} outside the recorded {lo:.2f}-{hi:.2f} with "
            "the depth shape in band: a change of traffic mix, not of the draft"
        )
    per = _fmt(s.per_pos)
    r, a0 = s.depth_ratio, s.first or 0.0
    if a0 < band.first_floor:
        floor = 100 * band.first_floor
        why = f"first-position acceptance {100 * a0:.0f}% below the floor {floor:.0f}%"
        return Reading(DROP, f"{why} (per position {per})", collapsed=collapsed, **base)
    if r is not None and r < band.depth_ratio_floor:
        where = f"; positions {', '.join(str(k) for k in collapsed)} collapsed" if collapsed else ""
        return Reading(
            DROP,
            f"depth ratio {r:.2f} below the band floor {band.depth_ratio_floor:.2f}: later "
            f"draft positions collapse (per position {per}){where}",
            collapsed=collapsed,
            **base,
        )
    return Reading(
        OK,
        f"depth ratio {r:.2f} >= floor {band.depth_ratio_floor:.2f} (per position {per})",
        collapsed=collapsed,
        note=note,
        **base,
    )
