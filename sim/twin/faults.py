"""The fault switch: `--twin-fault SPEC` or env `TWIN_FAULT=SPEC`.

Grammar (items separated by `;`, fields by `:`, an optional last field `rank0`/`rank1`
limits an item to one rank; without it the item applies to every rank):

    slow-boot:FACTOR[:rankR]          boot phases take FACTOR times as long
    crash:PHASE[+SECS][:rankR]        exit 1 at the start of PHASE (SECS after it, if given)
                                      PHASE: rendezvous | joined | loading | compiling |
                                             graphs | serving
    foreign:N:AT_S:FOR_S              N phantom requests arrive AT_S s after serving
                                      starts and occupy batch slots for FOR_S s (rank 0)
    stall:STEP:SECS                   engine step number STEP takes SECS longer (rank 0);
                                      beyond VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS it kills
                                      the engine, as a huge prefill step does in vLLM
    no-answers                        do not serve the quality gate's known answers (the
                                      gate then fails, as after a bad change)
    draft-decay:FACTOR[:FROM]         the conditional acceptance of draft positions FROM
                                      (0-based, default 1) and later times FACTOR (0..1):
                                      a draft that lost the weights its later positions
                                      need; the output text stays the same (rank 0)
    draft-weights-dropped             the field's dropped shared-expert draft weights: draft
                                      acceptance 60% -> 26% (rank 0)
    draft-grammar                     the field's tool-call grammar rejecting the drafts:
                                      acceptance per position at most .914/.224/0/0/0
    draft-first-collapse[:P]          the first draft position accepted at most with P
                                      (default 0.05), and so every later one (rank 0)
                                      (the draft faults, their sources and models:
                                      sim/twin/draft_faults.py)

Example: TWIN_FAULT='crash:compiling:rank1;foreign:4:10:30'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.twin.draft_faults import KINDS as DRAFT_KINDS
from sim.twin.draft_faults import DraftFault, parse_item

PHASES = ("rendezvous", "joined", "loading", "compiling", "graphs", "serving")


class FaultSpecError(ValueError):
    """A fault spec that does not follow the grammar in this module's docstring."""


@dataclass
class Faults:
    """Parsed faults for one rank."""

    slow_boot: float = 1.0
    crashes: dict[str, float] = field(default_factory=dict)  # phase -> delay s
    foreign: list[tuple[int, float, float]] = field(default_factory=list)
    stalls: dict[int, float] = field(default_factory=dict)
    no_answers: bool = False
    draft: list[DraftFault] = field(default_factory=list)  # applied in order (rank 0)
    spec: str = ""

    def crash_delay(self, phase: str) -> float | None:
        return self.crashes.get(phase)


def _num(text: str, what: str, item: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise FaultSpecError(f"fault {item!r}: {what} must be a number, got {text!r}") from None
    if val < 0:
        raise FaultSpecError(f"fault {item!r}: {what} must be >= 0")
    return val


def parse(spec: str | None, rank: int) -> Faults:
    """Parse SPEC, keeping only the items that apply to ``rank``."""
    out = Faults(spec=spec or "")
    if not spec:
        return out
    for raw in spec.replace(",", ";").split(";"):
        item = raw.strip()
        if not item:
            continue
        fields = item.split(":")
        only = None
        if fields[-1].startswith("rank"):
            try:
                only = int(fields[-1][4:])
            except ValueError:
                raise FaultSpecError(f"fault {item!r}: rank field must be rank0 or rank1") from None
            fields = fields[:-1]
        kind, args = fields[0], fields[1:]
        mine = only is None or only == rank
        if kind == "slow-boot" and len(args) == 1:
            factor = _num(args[0], "FACTOR", item)
            if mine:
                out.slow_boot = factor
        elif kind == "crash" and len(args) == 1:
            phase, _, delay = args[0].partition("+")
            if phase not in PHASES:
                raise FaultSpecError(f"fault {item!r}: PHASE must be one of {', '.join(PHASES)}")
            if mine:
                out.crashes[phase] = _num(delay, "SECS", item) if delay else 0.0
        elif kind == "foreign" and len(args) == 3:
            n = int(_num(args[0], "N", item))
            if mine and rank == 0:
                out.foreign.append((n, _num(args[1], "AT_S", item), _num(args[2], "FOR_S", item)))
        elif kind == "no-answers" and not args:
            if mine:
                out.no_answers = True
        elif kind in DRAFT_KINDS:
            try:
                fault = parse_item(kind, args, lambda text, what, it=item: _num(text, what, it))
            except FaultSpecError:
                raise
            except ValueError as exc:
                raise FaultSpecError(f"fault {item!r}: {exc}") from None
            if mine and rank == 0:
                out.draft.append(fault)
        elif kind == "stall" and len(args) == 2:
            step = int(_num(args[0], "STEP", item))
            if mine and rank == 0:
                out.stalls[step] = out.stalls.get(step, 0.0) + _num(args[1], "SECS", item)
        else:
            raise FaultSpecError(
                f"fault {item!r} not understood; expected slow-boot:FACTOR, "
                "crash:PHASE[+SECS], foreign:N:AT_S:FOR_S, stall:STEP:SECS, no-answers or "
                "draft-decay:FACTOR[:FROM], draft-weights-dropped, draft-grammar, "
                "draft-first-collapse[:P], "
                "optionally ending in :rank0 or :rank1"
            )
    return out
