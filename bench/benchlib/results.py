"""A run's recorded points, the exit code they imply, their summaries, and the result JSON.

Every script records each measured point here and summarises the points of one label (a depth,
a concurrency level, a phase, a turn) the same way: the distribution of each metric over the clean
runs, then how many runs were clean, how many retries they took, and the row's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.benchlib import EXIT_CONTAMINATED, EXIT_ERROR, EXIT_OK, SCHEMA_VERSION, conserve
from bench.benchlib.cli import log
from bench.benchlib.guard import GuardedPoint
from bench.benchlib.stats import summarize

Point = dict[str, Any]  # one recorded point, as it appears in the JSON's "points"


class Results:
    """The points of one run, and the exit code and reasons they add up to."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.exit_code = EXIT_OK
        self.exit_reasons: list[str] = []
        self.verdicts: list[conserve.Verdict] = []  # conservation of every clean point

    def add(
        self, label: str, gp: GuardedPoint, metrics: dict[str, Any] | None, **extra: Any
    ) -> Point:
        """Record one point; a contaminated or failed point carries no numbers, only why.

        A contaminated point makes the run exit 3 (unless it already failed: 1 wins); a point
        whose clean wave had a failed request makes it exit 1.
        """
        status = gp.status
        if status == "ok" and metrics is not None and metrics.get("error"):
            status = "error"
        point = {
            "label": label,
            "status": status,
            "retries": gp.retries,
            "reason": gp.reason if status != "error" else metrics["error"],
            **extra,
            "metrics": metrics if status == "ok" else None,
            "server_deltas": gp.deltas if status == "ok" else None,
            "conservation": None,
            "attempts": [a.to_json() for a in gp.attempts],
        }
        verdict = gp.conservation
        if status == "ok" and verdict is not None:
            point["conservation"] = verdict.to_json()
            self.verdicts.append(verdict)
        if status == "contaminated":
            self.exit_reasons.append(f"{label}: {gp.reason}")
            if self.exit_code == EXIT_OK:
                self.exit_code = EXIT_CONTAMINATED
            log(f"{label}: NO NUMBER — {gp.reason}")
        elif status == "error":
            self.exit_reasons.append(f"{label}: {point['reason']}")
            self.exit_code = EXIT_ERROR
            log(f"{label}: ERROR — {point['reason']}")
        self.points.append(point)
        return point

    def fail(self, why: str) -> None:
        """The run cannot go on (endpoint not ready, test request failed, guard unusable)."""
        log(f"error: {why}")
        self.exit_code = EXIT_ERROR
        self.exit_reasons.append(why)

    def conservation(self) -> dict[str, Any]:
        """What token conservation vouched for over the clean points, and what it could not."""
        checked: list[str] = []  # in check order, the per-position checks as one
        for v in self.verdicts:
            for c in v.checks:
                name = "accepted per position" if c.name.startswith("accepted at") else c.name
                if c.verdict == "equal" and name not in checked:
                    checked.append(name)
        unchecked = sorted({u for v in self.verdicts for u in v.unchecked})
        return {
            "clean_points": len(self.verdicts),
            "conserved": checked,
            "unchecked": unchecked,
            "acceptance": conserve.describe(v.acceptance for v in self.verdicts),
        }

    def conservation_lines(self) -> list[str]:
        """The report's footer: the guard's second line of defence and its gaps."""
        c = self.conservation()
        if not c["clean_points"]:
            return ["token conservation: no clean point to check"]
        lines = [
            f"token conservation on {c['clean_points']} clean point(s): "
            + (", ".join(c["conserved"]) or "nothing")
            + " = our own requests"
        ]
        if c["unchecked"]:
            lines.append("NOT checked by conservation: " + "; ".join(c["unchecked"]))
        lines.append(c["acceptance"])
        return lines

    def document(self, run: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        """The result JSON (schema 1): the run's facts, its exit, the summary, every point."""
        return {
            "schema_version": SCHEMA_VERSION,
            **run,
            "exit_code": self.exit_code,
            "exit_reasons": self.exit_reasons,
            "conservation": self.conservation(),
            "summary": summary,
            "points": self.points,
        }


@dataclass(frozen=True)
class Tally:
    """How the runs behind one summary row went."""

    runs_ok: int
    retries: int
    status: str  # "ok" when every run was clean, else the status of the last run

    @classmethod
    def of(cls, points: Sequence[Point]) -> Tally:
        ok = sum(pt["status"] == "ok" for pt in points)
        status = "ok" if ok == len(points) else points[-1]["status"]
        return cls(ok, sum(pt["retries"] for pt in points), status)


def clean_metrics(points: Iterable[Point]) -> list[dict[str, Any]]:
    """The metrics of the points measured on a clean wave (the only ones with numbers)."""
    return [pt["metrics"] for pt in points if pt["status"] == "ok"]


@dataclass
class PointSummary:
    """One summary row: metric distributions over the clean runs, then how the runs went."""

    stats: dict[str, dict[str, Any]]  # metric -> stats.summarize() of it
    tally: Tally
    extra: dict[str, Any] = field(default_factory=dict)  # row values that are not distributions

    def median(self, key: str) -> float | None:
        return self.stats[key]["median"]

    def to_json(self, runs_ok: bool = True) -> dict[str, Any]:
        """The row as the JSON's summary holds it (chat turns carry no runs_ok in schema 1)."""
        out = {**self.stats, **self.extra}
        if runs_ok:
            out["runs_ok"] = self.tally.runs_ok
        return out | {"retries": self.tally.retries, "status": self.tally.status}


def summarize_points(points: Sequence[Point], keys: Iterable[str]) -> PointSummary:
    """Distributions of `keys` over the clean points (missing values are skipped), and the tally."""
    ok = clean_metrics(points)
    return PointSummary({k: summarize(m.get(k) for m in ok) for k in keys}, Tally.of(points))
