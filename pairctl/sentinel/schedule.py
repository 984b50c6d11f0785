"""``watch``'s acceptance probe rounds: every ``every_s`` seconds each probe prompt is read
once and judged against its own record (pairctl.sentinel.judgement).

A round runs after the watchdog's good token probes, one prompt after the other (a prompt
that cannot be read ends the round at once: the watchdog's next token probe judges an
engine that stopped answering, and no tick waits on more than one failed request). A reading
the pair's traffic would contaminate is not taken (``BUSY``: requests running, or other
tokens generated during it, pairctl.sentinel.probe): that prompt waits for the next tick,
and a round still unfinished after ``give_up_s`` ends as ``busy`` (not judged; with
``--per-request-spec-decode-metrics`` the probe needs no idle pair). A prompt FAULTs only
when two readings in a row fall below its floor: the second, taken at once, rules out a
reading that was off by chance (a deterministic engine repeats it exactly).

A round's states: ``ok``; ``fault`` (the event: a prompt below its floor twice, or a pair
that no longer drafts at all while its record says it did); ``error`` (also an event: a
prompt could not be read, e.g. an HTTP error or a reply with too few drafts to judge: a
probe that cannot run would miss the fault it is there for); ``busy``; ``no-record``
(nothing to judge against: ``up --gate`` or ``sentinel record`` makes one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pairctl.log import stamp
from pairctl.sentinel.judgement import FAULT, OK, PromptVerdict, judge, not_drafting
from pairctl.sentinel.probe import BUSY, NO_SPEC, Measurement, ProbePrompt, Skip
from pairctl.sentinel.probefile import ProbeRecord

ERROR, BUSY_STATE, NO_RECORD = "error", "busy", "no-record"
EVENT_STATES = (FAULT, ERROR)


@dataclass
class Reading:
    """One finished round (or why there is none), as watch logs it and the record keeps it."""

    state: str  # ok | fault | error | busy | no-record
    detail: str
    at: str
    key: str = ""  # the record's stack/recipe/revision
    record: str | None = None  # its path
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def event(self) -> bool:
        return self.state in EVENT_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ProbeSchedule:
    """The rounds of one pair; every effect injected (unit-tested)."""

    def __init__(
        self,
        every_s: float,
        prompts: list[ProbePrompt],
        measure: Callable[[ProbePrompt], Measurement | Skip],
        record: Callable[[], ProbeRecord | None],
        clock: Callable[[], float],
        give_up_s: float | None = None,
    ) -> None:
        self.every_s, self.prompts, self.measure = every_s, prompts, measure
        self.record, self.clock = record, clock
        self.give_up_s = every_s if give_up_s is None else give_up_s
        self.next_due = clock()
        self.started: float | None = None
        self.pending: list[ProbePrompt] = []
        self.verdicts: dict[str, PromptVerdict] = {}
        self.skipped: dict[str, Skip] = {}
        self.rec: ProbeRecord | None = None

    def tick(self) -> Reading | None:
        """Take the readings due now; the Reading when a round ended, else None."""
        now = self.clock()
        if self.started is None:
            if now < self.next_due:
                return None
            self.rec = self.record()
            if self.rec is None:
                self.next_due = now + self.every_s
                return Reading(NO_RECORD, "no probe record for this pair's key", stamp())
            pending = [p for p in self.prompts if p.name in self.rec.prompts]
            if not pending:
                self.next_due = now + self.every_s
                return Reading(
                    NO_RECORD,
                    f"the record {self.rec.path} has none of the probe's prompts "
                    f"({', '.join(p.name for p in self.prompts)}): record the probe again",
                    stamp(),
                    key=self.rec.key.label(),
                )
            self.started, self.pending = now, pending
            self.verdicts, self.skipped = {}, {}
        assert self.rec is not None
        while self.pending:
            p = self.pending[0]
            got = self._read(p, self.rec)
            if isinstance(got, Skip) and got.reason == BUSY:
                self.skipped[p.name] = got
                if now - self.started >= self.give_up_s:
                    return self._end(now, busy=True)
                return None
            self.pending.pop(0)
            if isinstance(got, Skip):  # an error: the round ends, the next tick probes tokens
                self.skipped[p.name] = got
                break
            self.skipped.pop(p.name, None)
            self.verdicts[p.name] = got
        return self._end(now)

    def _read(self, p: ProbePrompt, rec: ProbeRecord) -> PromptVerdict | Skip:
        """A verdict, confirmed by a second reading when the first is below the floor."""
        first = self.measure(p)
        if isinstance(first, Skip):
            if first.reason == NO_SPEC:
                return not_drafting(p.name, first.detail, rec.prompts[p.name])
            return first
        v = judge(first, rec.prompts[p.name])
        if v.state == OK:
            return v
        again = self.measure(p)
        if isinstance(again, Skip):
            return again  # BUSY: the prompt is read again at the next tick
        v2 = judge(again, rec.prompts[p.name])
        if v2.state == OK:
            note = (v2.note + "; " if v2.note else "") + f"not confirmed: {v.detail}"
            return replace(v2, note=note)
        return v2

    def _end(self, now: float, busy: bool = False) -> Reading:
        rec = self.rec
        assert rec is not None
        verdicts = [self.verdicts[p.name] for p in self.prompts if p.name in self.verdicts]
        skipped = [self.skipped[p.name] for p in self.prompts if p.name in self.skipped]
        faults = [v for v in verdicts if v.state == FAULT]
        errors = [s for s in skipped if s.reason != BUSY]
        if faults:
            state, detail = FAULT, "; ".join(v.detail for v in faults)
        elif errors:
            state = ERROR
            detail = "; ".join(f"{s.name} not read ({s.reason}): {s.detail}" for s in errors)
        elif busy:
            waited = ", ".join(p.name for p in self.pending)
            took = now - (self.started if self.started is not None else now)
            state = BUSY_STATE
            detail = (
                f"{waited} not read in {took:.0f} s: the pair was never idle (a server "
                "started with --per-request-spec-decode-metrics summary is probed under "
                "traffic)"
            )
        else:
            state = OK
            detail = f"{len(verdicts)} prompt(s) at or above their record's floors"
        self.started, self.next_due = None, now + self.every_s
        return Reading(
            state,
            detail,
            stamp(),
            key=rec.key.label(),
            record=str(rec.path) if rec.path else None,
            verdicts=[v.to_dict() for v in verdicts],
            skipped=[s.to_dict() for s in skipped],
        )
