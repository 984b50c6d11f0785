"""The acceptance probe's judgement: each prompt against its own record. Pure functions.

A prompt's record is what a known-good pair showed for it over N repeats: per draft position
the mean of ``A_k / drafts`` and its spread (largest less smallest). Its floor per position is

    floor_k = mean_k - spread_k - max(ABSOLUTE_MARGIN, RELATIVE_MARGIN x mean_k)   (>= 0)

and a reading FAULTs when any position falls below its floor. The prompt, the decoding
(greedy) and the engine are the same as when the record was made, so a healthy pair repeats
its record to within the spread (exactly, on a deterministic engine); the margins are there
for what the repeats did not show. Traffic does not enter: a reading is the probe's own
request (pairctl.sentinel.probe), and a prompt is only ever compared with itself, so neither
the mix nor the shape of what the pair serves can move a judgement.

What fires, with the default margins (per position; the field's figures):
- dropped draft weights (the draft acceptance rate 60% -> 26%, tonyd2wild's "Patch 4"):
  position 0 of a prose-like prompt 0.60 -> 0.42 (floor 0.45), position 1 of an agent-like
  one 0.62 -> 0.31 (floor 0.47);
- a grammar rejecting the drafts (.914/.224/0/0/0, ecohash-co README): position 2 of any
  prompt that had it above ABSOLUTE_MARGIN (agent 0.46, floor 0.35) reads 0;
- a position-0 collapse: position 0 of every prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pairctl.contracts import PROBE_ABSOLUTE_MARGIN, PROBE_RELATIVE_MARGIN
from pairctl.sentinel.probe import Measurement

ABSOLUTE_MARGIN = PROBE_ABSOLUTE_MARGIN
RELATIVE_MARGIN = PROBE_RELATIVE_MARGIN
OK, FAULT = "ok", "fault"


class RecordError(ValueError):
    """Repeats that cannot make a record (positions disagree, none given)."""


@dataclass(frozen=True)
class Margins:
    absolute: float = ABSOLUTE_MARGIN
    relative: float = RELATIVE_MARGIN


@dataclass(frozen=True)
class PromptRecord:
    """One prompt on a known-good pair: per position the mean, spread and floor of
    ``A_k / drafts`` over its repeats (each repeat's figures kept)."""

    name: str
    kind: str
    per_pos: tuple[float, ...]
    spread: tuple[float, ...]
    floor: tuple[float, ...]
    mean_length: float
    repeats: tuple[tuple[float, ...], ...] = ()
    drafts: tuple[int, ...] = ()
    method: str = ""

    @property
    def positions(self) -> int:
        return len(self.per_pos)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("per_pos", "spread", "floor"):
            out[k] = [round(x, 4) for x in out[k]]
        out["repeats"] = [[round(x, 4) for x in r] for r in self.repeats]
        out["mean_length"] = round(self.mean_length, 4)
        return out


def floors(mean: tuple[float, ...], spread: tuple[float, ...], m: Margins) -> tuple[float, ...]:
    """Per position: mean less spread less the larger margin, never below 0."""
    return tuple(
        round(max(0.0, x - s - max(m.absolute, m.relative * x)), 4)
        for x, s in zip(mean, spread, strict=True)
    )


def summarise(
    name: str, kind: str, repeats: list[Measurement], m: Margins | None = None
) -> PromptRecord:
    """The record of one prompt from its repeats (RecordError when they cannot make one)."""
    if not repeats:
        raise RecordError(f"{name}: no reading to record")
    k = {len(r.accepted) for r in repeats}
    if len(k) != 1:
        raise RecordError(f"{name}: the repeats drafted different numbers of positions {k}")
    rows = [r.per_pos for r in repeats]
    cols = list(zip(*rows, strict=True))
    mean = tuple(sum(c) / len(c) for c in cols)
    spread = tuple(max(c) - min(c) for c in cols)
    return PromptRecord(
        name=name,
        kind=kind,
        per_pos=tuple(round(x, 4) for x in mean),
        spread=tuple(round(x, 4) for x in spread),
        floor=floors(mean, spread, m or Margins()),
        mean_length=sum(r.mean_length for r in repeats) / len(repeats),
        repeats=tuple(rows),
        drafts=tuple(r.drafts for r in repeats),
        method=",".join(sorted({r.method for r in repeats})),
    )


@dataclass(frozen=True)
class PromptVerdict:
    """One reading of one prompt against its record."""

    name: str
    state: str  # OK | FAULT
    detail: str
    per_pos: list[float]
    floor: list[float]
    recorded: list[float]
    below: list[int] = field(default_factory=list)  # positions under their floor
    drafts: int = 0
    method: str = ""
    note: str = ""

    @property
    def event(self) -> bool:
        return self.state == FAULT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def not_drafting(name: str, why: str, rec: PromptRecord) -> PromptVerdict:
    """A server that no longer drafts at all (no spec-decode counters), though the record
    says it did: every position at 0, the fault."""
    k = rec.positions
    return PromptVerdict(
        name=name,
        state=FAULT,
        detail=f"{name}: the server no longer drafts ({why}); the record has {k} draft positions",
        per_pos=[0.0] * k,
        floor=list(rec.floor),
        recorded=list(rec.per_pos),
        below=[x for x in range(k) if rec.floor[x] > 0],
    )


def _pct(xs: list[float] | tuple[float, ...]) -> str:
    return "/".join(f"{100 * x:.0f}" for x in xs) + "%"


def judge(m: Measurement, rec: PromptRecord) -> PromptVerdict:
    """A reading against its prompt's record. A server that drafts fewer positions than the
    record has accepted nothing at the missing ones (they count as 0); one that drafts more
    is judged on the recorded positions, with a note to record again."""
    got = list(m.per_pos[: rec.positions]) + [0.0] * max(0, rec.positions - len(m.per_pos))
    note = ""
    if len(m.per_pos) != rec.positions:
        note = (
            f"the server drafts {len(m.per_pos)} position(s), the record has {rec.positions}: "
            "if that change is intended, record the probe again"
        )
    below = [k for k in range(rec.positions) if got[k] < rec.floor[k]]
    base = {
        "name": m.name,
        "per_pos": [round(x, 4) for x in got],
        "floor": list(rec.floor),
        "recorded": list(rec.per_pos),
        "below": below,
        "drafts": m.drafts,
        "method": m.method,
        "note": note,
    }
    if below:
        where = ", ".join(str(k) for k in below)
        return PromptVerdict(
            state=FAULT,
            detail=f"{m.name}: below the floor at position {where}: {_pct(got)} against "
            f"floors {_pct(rec.floor)} (recorded {_pct(rec.per_pos)}) over {m.drafts} drafts",
            **base,
        )
    return PromptVerdict(
        state=OK,
        detail=f"{m.name}: per position {_pct(got)} at or above its floor {_pct(rec.floor)}",
        **base,
    )
