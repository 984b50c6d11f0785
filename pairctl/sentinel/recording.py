"""Making a probe record, and the check ``up --gate`` runs against one: the steps
``sentinel record`` and ``up --gate`` share.

A record is each probe prompt read ``repeats`` times (pairctl.sentinel.judgement.summarise).
A reading the pair's traffic would contaminate waits (``busy_wait_s`` at most, then the
recording fails saying so); any other prompt that cannot be read (HTTP error, no spec-decode
counters, too few drafts) fails it at once. Nothing is written unless every prompt was read
every time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pairctl.log import stamp
from pairctl.sentinel import probefile
from pairctl.sentinel.judgement import (
    FAULT,
    Margins,
    PromptRecord,
    PromptVerdict,
    judge,
    not_drafting,
    summarise,
)
from pairctl.sentinel.probe import BUSY, NO_SPEC, Measurement, ProbePrompt, Skip
from pairctl.sentinel.probeclient import ProbeClient
from pairctl.sentinel.probefile import ProbeKey, ProbeRecord

BUSY_WAIT_S = 600.0
BUSY_RETRY_S = 5.0


class RecordFailed(RuntimeError):
    """The recording (or the check) cannot go on; the message says what to do."""


def read_when_idle(
    client: ProbeClient,
    prompt: ProbePrompt,
    busy_wait_s: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Measurement | Skip:
    """One reading, waiting out a busy pair up to ``busy_wait_s`` (then RecordFailed); a
    reading that failed otherwise comes back as its Skip."""
    end = clock() + busy_wait_s
    said = False
    while True:
        got = client.measure(prompt)
        if isinstance(got, Measurement) or got.reason != BUSY:
            return got
        if clock() >= end:
            raise RecordFailed(
                f"probe prompt {prompt.name}: the pair stayed busy for {busy_wait_s:g} s "
                f"({got.detail}); record while it is idle, or start the server with "
                "--per-request-spec-decode-metrics summary"
            )
        if not said:
            log(f"probe prompt {prompt.name}: {got.detail}; waiting for an idle pair")
            said = True
        sleep(BUSY_RETRY_S)


def take(
    client: ProbeClient,
    repeats: int,
    margins: Margins,
    log: Callable[[str], None],
    busy_wait_s: float = BUSY_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> list[PromptRecord]:
    """Every prompt ``repeats`` times, then one record per prompt."""
    out = []
    for p in client.probes.prompts:
        reads = []
        for i in range(repeats):
            m = read_when_idle(client, p, busy_wait_s, log, sleep)
            if isinstance(m, Skip):
                raise RecordFailed(f"probe prompt {p.name}: {m.detail}")
            per = "/".join(f"{100 * x:.0f}" for x in m.per_pos)
            log(f"probe {p.name} {i + 1}/{repeats}: {per}% over {m.drafts} drafts ({m.method})")
            reads.append(m)
        try:
            out.append(summarise(p.name, p.kind, reads, margins))
        except ValueError as exc:
            raise RecordFailed(str(exc)) from None
    return out


def recorded_doc(
    client: ProbeClient,
    key: ProbeKey,
    prompts: list[PromptRecord],
    margins: Margins,
    repeats: int,
    simulator: bool,
    plan_hash: str = "",
) -> dict[str, Any]:
    """The record file's document: the prompts' records and how they were taken."""
    recorded = {
        "at": stamp(),
        "endpoint": client.endpoint.base,
        "model": client.model,
        "simulator": simulator,
        "repeats": repeats,
        "prompts_file": client.probes.source,
        "max_tokens": client.probes.max_tokens,
        "per_request_metrics": client.per_request,
        "plan_hash": plan_hash,
    }
    m = {"absolute": margins.absolute, "relative": margins.relative}
    return probefile.document(key, prompts, m, recorded)


def write(path: Path, doc: dict[str, Any]) -> None:
    try:
        probefile.save(path, doc)
    except OSError as exc:
        raise RecordFailed(f"writing {path}: {exc.strerror or exc}") from None


def summary(prompts: list[PromptRecord]) -> str:
    return "; ".join(
        f"{p.name} " + "/".join(f"{100 * x:.0f}" for x in p.per_pos) + "%"
        f" (spread {max(p.spread) * 100:.0f} pt)"
        for p in prompts
    )


def check(
    client: ProbeClient,
    rec: ProbeRecord,
    log: Callable[[str], None],
    busy_wait_s: float = BUSY_WAIT_S,
) -> list[PromptVerdict]:
    """Each recorded prompt read once (a reading below the floor read again: both must be
    below to count) and judged; the verdicts."""
    out = []
    for p in client.probes.prompts:
        if p.name in rec.prompts:
            v = _verdict(client, p, rec, busy_wait_s, log)
            if v.state == FAULT:
                v = _verdict(client, p, rec, busy_wait_s, log)
            log(f"probe {v.detail}")
            out.append(v)
    if not out:
        raise RecordFailed(
            f"the record {rec.path} has none of the probe's prompts: record the probe again"
        )
    return out


def _verdict(
    client: ProbeClient,
    p: ProbePrompt,
    rec: ProbeRecord,
    busy_wait_s: float,
    log: Callable[[str], None],
) -> PromptVerdict:
    got = read_when_idle(client, p, busy_wait_s, log)
    if isinstance(got, Measurement):
        return judge(got, rec.prompts[p.name])
    if got.reason == NO_SPEC:
        return not_drafting(p.name, got.detail, rec.prompts[p.name])
    raise RecordFailed(f"probe prompt {p.name}: {got.detail}")
