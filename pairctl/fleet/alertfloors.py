"""The floors of the acceptance alerts, from healthy acceptance profiles: a generated rule file.

Live acceptance moves with traffic: prose runs ~2.0-2.2 tokens per verify step on a healthy
DSpark pair, agent traffic ~3.5, code 4.4-4.8 (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark,
agent doc). An alert on live counters is only trustworthy if no healthy class can reach its
floor, so each floor is derived from the healthy classes, never typed in: half the lowest
figure any healthy class shows (a harder stretch of the same kind of traffic may run below
its class, not to half of it), while the broken signatures fall further (dropped draft
weights: position 0 from 60% to 26%, tonyd2wild "Patch 4"; a grammar rejecting every draft
past position 1: .914/.224/0/0/0, ecohash-co README; a position-0 collapse).

Each figure is a ratio of sums of vLLM 0.33's spec-decode counters
(vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``), and a ratio of sums over any mix of
classes lies between the classes' own figures: a floor under every healthy class cannot be
reached by any mix of them, whatever its shape.

The seam: ``ANCHOR`` (published figures) is the default; a recorded acceptance probe supplies
its own classes as a file (``load_classes``: per-position acceptance and the repeat spread,
per prompt kind) and ``fleet alert-floors --classes FILE`` writes the rule file Prometheus
loads beside monitoring/prometheus/dsv4-alerts.yml. The alerts compare against the recorded
series, so new floors need no edit of the alert rules.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# A healthy class may run at this share of its figure before an alert (a harder stretch of
# the same kind of traffic runs below its class, not to half of it).
HALF = 0.5
# Conditional acceptance judged for "later positions collapse": position LATE given LATE - 1.
LATE = 2
# Volume guards: below them a window judges noise, not the draft. 5 draft tokens/s over the
# 15-min window is ~0.9k drafts of 5 (one stream decoding for about a minute of the window):
# the standard error of an acceptance share from that many drafts is at most 0.017, far under the
# gap between a floor and the class above it. Position LATE - 1 is tried less often than
# position 0: 0.25 accepted per second is 225 tries of position LATE in the window (a
# standard error of at most 0.034 on its conditional acceptance).
MIN_DRAFT_TOKENS_PER_S = 5.0
MIN_LATE_TRIES_PER_S = 0.25
DEFAULT_OUTPUT = Path("monitoring/prometheus/dsv4-acceptance-floors.yml")
PREFIX = "dsv4:acceptance_floor:"


class FloorsError(ValueError):
    """A classes file that cannot be read or does not have the expected shape."""


@dataclass(frozen=True)
class HealthyClass:
    """One kind of healthy traffic: P(draft position k accepted) = A_k / drafts, k = 0..K-1
    (what vLLM logs as "Per-position acceptance rate"), and the repeat spread of each."""

    name: str
    per_pos: tuple[float, ...]
    spread: tuple[float, ...] = ()
    source: str = ""

    def low(self) -> tuple[float, ...]:
        """Each position's figure less its spread (the low end of the class's repeats)."""
        s = self.spread or (0.0,) * len(self.per_pos)
        return tuple(max(0.0, p - d) for p, d in zip(self.per_pos, s, strict=True))

    def high(self) -> tuple[float, ...]:
        s = self.spread or (0.0,) * len(self.per_pos)
        return tuple(min(1.0, p + d) for p, d in zip(self.per_pos, s, strict=True))


# Until a probe is recorded: the published figures. Only the agent class's split per
# position is published; for prose and code only the mean length is, so the split below
# keeps that mean (the low end of the published range) and assumes the first position.
ANCHOR: tuple[HealthyClass, ...] = (
    HealthyClass(
        "prose",
        (0.600, 0.244, 0.099, 0.040, 0.016),
        source="mean length 2.0 (MiaAI agent doc: prose 2.0-2.2); assumed split: position 0 "
        "at 60% (the healthy draft of tonyd2wild's Patch 4 report), each later position "
        "accepted 41% of the time after the one before",
    ),
    HealthyClass(
        "agent",
        (0.816, 0.623, 0.460, 0.332, 0.240),
        source="MiaAI agent doc: 81.6/62.3/46.0/33.2/24.0% by position, ~3.5 tok/step",
    ),
    HealthyClass(
        "code",
        (0.920, 0.782, 0.665, 0.565, 0.480),
        source="mean length 4.4 (MiaAI agent doc: code 4.4-4.8); assumed split: position 0 "
        "at 92%, each later position 85% after the one before",
    ),
)


ANCHOR_SOURCE = "the published classes (pairctl/fleet/alertfloors.py ANCHOR)"


@dataclass(frozen=True)
class Floors:
    """What the alert rules compare against (each a recorded series ``PREFIX + name``)."""

    mean_length: float  # 1 + accepted / drafts
    first_position: float  # A_0 / drafts
    late_conditional: float  # A_LATE / A_(LATE-1)
    min_draft_tokens_per_s: float = MIN_DRAFT_TOKENS_PER_S
    min_late_tries_per_s: float = MIN_LATE_TRIES_PER_S

    def series(self) -> dict[str, float]:
        return {PREFIX + k: v for k, v in vars(self).items()}


def floors(classes: tuple[HealthyClass, ...]) -> Floors:
    """HALF of the lowest figure any class shows, each class at the low end of its spread.

    Raises FloorsError for no class, positions that disagree, or fewer than LATE + 1."""
    if not classes:
        raise FloorsError("no healthy class given")
    k = {len(c.per_pos) for c in classes}
    if len(k) != 1 or min(k) <= LATE:
        raise FloorsError(f"every class needs the same number (> {LATE}) of positions, got {k}")
    accepted = min(sum(c.low()) for c in classes)
    first = min(c.low()[0] for c in classes)
    late = min(_div(c.low()[LATE], c.high()[LATE - 1]) for c in classes)
    return Floors(
        mean_length=round(1 + HALF * accepted, 3),
        first_position=round(HALF * first, 3),
        late_conditional=round(HALF * late, 3),
    )


def _div(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def load_classes(path: str | Path) -> tuple[tuple[HealthyClass, ...], str]:
    """A classes file (JSON or YAML): ``{"source": ..., "classes": [{"name", "per_pos",
    "spread"?}]}``; per_pos and spread are shares (0..1) per draft position. Returns the
    classes and the file's source line."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FloorsError(f"{p}: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("classes"), list):
        raise FloorsError(f"{p}: expected a mapping with a list `classes`")
    out = []
    for i, c in enumerate(doc["classes"]):
        out.append(_healthy_class(c, f"{p}: classes[{i}]"))
    return tuple(out), str(doc.get("source") or p.name)


def _healthy_class(c: Any, where: str) -> HealthyClass:
    try:
        per_pos = tuple(float(x) for x in c["per_pos"])
        spread = tuple(float(x) for x in c.get("spread") or ())
        name = str(c["name"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FloorsError(f"{where}: needs name and per_pos (numbers): {exc}") from exc
    if not all(0.0 <= x <= 1.0 for x in per_pos + spread):
        raise FloorsError(f"{where}: per_pos and spread are shares in [0, 1]")
    if any(b > a for a, b in zip(per_pos, per_pos[1:], strict=False)):
        raise FloorsError(f"{where}: per_pos cannot grow with the position (A_k <= A_(k-1))")
    if spread and len(spread) != len(per_pos):
        raise FloorsError(f"{where}: spread needs one entry per position")
    return HealthyClass(name, per_pos, spread, str(c.get("source") or ""))


def _comment(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, 92, initial_indent="# " + indent, subsequent_indent="# " + indent)


def render(classes: tuple[HealthyClass, ...], source: str) -> str:
    """The rule file: one recording rule per floor, the classes it came from in comments."""
    f = floors(classes)
    head = [
        "# Floors of the DSpark acceptance alerts (monitoring/prometheus/dsv4-alerts.yml).",
        "# GENERATED by `launch/dspark_launch.sh fleet alert-floors`",
        "# (pairctl/fleet/alertfloors.py); regenerate, do not edit. Load it beside",
        "# dsv4-alerts.yml; without it the acceptance alerts cannot fire, and",
        "# DSv4AcceptanceFloorsMissing says so.",
        *_comment(
            f"From: {source}. Each floor is {HALF:g} x the lowest figure of these healthy "
            "classes (per-position acceptance A_k / drafts, less the repeat spread):"
        ),
    ]
    for c in classes:
        fig = "/".join(f"{x:.3f}" for x in c.per_pos)
        head.append(f"#   {c.name}: {fig} (mean length {1 + sum(c.per_pos):.2f})")
        if c.source:
            head += _comment(c.source, "    ")
    head += _comment(
        f"Volume guards: >= {f.min_draft_tokens_per_s:g} draft tokens/s, and >= "
        f"{f.min_late_tries_per_s:g} position-{LATE - 1} acceptances/s for the late rule."
    )
    rules = [{"record": name, "expr": f"vector({value:g})"} for name, value in f.series().items()]
    body = {"groups": [{"name": "dsv4-acceptance-floors", "rules": rules}]}
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False)
