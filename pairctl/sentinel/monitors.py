"""What ``watch`` does besides its token probe: the acceptance probe and the output canary.

Both run after a token probe that succeeded (a pair that generates nothing is the restart
policy's business), and both only ever log: a probe FAULT or ERROR, a bad canary reply or a
canary prompt that could not be judged is an event line, never a reason to restart (a
restart keeps the bad draft or image, and would hide the cause). Each reading is also
written to the pair's monitor record (``record_path``), which ``status`` shows as
"recorded by watch". The probe's rounds: pairctl.sentinel.schedule.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pairctl.contracts import CANARY_EVERY_S, PROBE_EVERY_S
from pairctl.log import stamp
from pairctl.sentinel.canary import CanaryResult, failed_run
from pairctl.sentinel.schedule import BUSY_STATE, ERROR, FAULT, OK, ProbeSchedule, Reading

DEFAULT_CANARY_EVERY_S = float(CANARY_EVERY_S)  # 4 runs an hour x 5 short greedy answers
DEFAULT_PROBE_EVERY_S = float(PROBE_EVERY_S)
RECORD_FRESH_S = 3600.0  # status shows a record at most this old


@dataclass(frozen=True)
class MonitorConfig:
    canary_every_s: float = DEFAULT_CANARY_EVERY_S  # 0: no canary
    probe_every_s: float = DEFAULT_PROBE_EVERY_S  # 0: no acceptance probe


def record_path(lock_path: str, pair_id: str, spark1: str) -> Path:
    """The pair's monitor record, beside its launcher lock (same directory, same naming)."""
    return Path(lock_path).with_name(f"dsv4-monitor-{pair_id}-{spark1}.json")


def probe_line(r: Reading, last: str | None) -> str:
    """The log line of a finished round (pairctl/sentinel/schedule.py's states)."""
    where = f" [{r.key}]" if r.key else ""
    if r.state == FAULT:
        return f"ACCEPTANCE PROBE FAULT (no restart): {r.detail}{where}"
    if r.state == ERROR:
        return f"ACCEPTANCE PROBE ERROR (no restart): {r.detail}{where}"
    if r.state == OK and last in (FAULT, ERROR):
        return f"acceptance probe back at its record: {r.detail}{where}"
    if r.state == BUSY_STATE:
        return f"acceptance probe not judged: {r.detail}{where}"
    return f"acceptance probe {r.state}: {r.detail}{where}"


class Monitors:
    """The acceptance probe and the canary for one pair; every effect injected."""

    def __init__(
        self,
        cfg: MonitorConfig,
        probe: ProbeSchedule | None,
        canary: Callable[[], CanaryResult] | None,
        log: Callable[[str], None],
        record: Path | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.cfg, self.probe, self.canary = cfg, probe, canary
        self.log, self.record = log, record
        self.clock = clock or time.monotonic
        self.last_state: str | None = None
        self.next_canary = self.clock()  # the first run right after the first good probe
        self.doc: dict[str, Any] = {}

    def after_ok_probe(self) -> None:
        """The probe's readings that are due, and the canary when it is due; log, record."""
        if self.probe is not None and self.cfg.probe_every_s > 0:
            self._probe()
        now = self.clock()
        if self.canary is not None and self.cfg.canary_every_s > 0 and now >= self.next_canary:
            self.next_canary = now + self.cfg.canary_every_s
            try:
                res = self.canary()
            except Exception as exc:  # noqa: BLE001 - a canary that cannot run is an event
                res = failed_run(exc)
            self.doc["canary"] = res.to_dict()
            if res.events:
                self.log(f"CANARY EVENT (no restart): {res.summary()}")
            else:
                self.log(res.summary())
        self._write()

    def _probe(self) -> None:
        assert self.probe is not None
        try:
            r = self.probe.tick()
        except Exception as exc:  # noqa: BLE001 - a probe that cannot run is an event
            self.probe.started = None
            r = Reading(ERROR, f"the probe could not run ({type(exc).__name__}: {exc})", "")
        if r is None:
            return
        self.doc["probe"] = r.to_dict()
        if r.state != self.last_state or r.event:
            self.log(probe_line(r, self.last_state))
        self.last_state = r.state

    def _write(self) -> None:
        if self.record is None:
            return
        doc = {
            "written_at": stamp(),
            **self.doc,
        }
        tmp = self.record.with_name(self.record.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc) + "\n")
            tmp.replace(self.record)
        except OSError as exc:
            self.log(f"cannot write the monitor record {self.record}: {exc.strerror or exc}")


def read_record(path: Path, max_age_s: float = RECORD_FRESH_S) -> dict[str, Any] | None:
    """The monitor record watch wrote, if there is a fresh one (else None)."""
    try:
        doc = json.loads(path.read_text())
        written = datetime.fromisoformat(doc["written_at"].replace("Z", "+00:00"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    age = (datetime.now(UTC) - written).total_seconds()
    if age > max_age_s:
        return None
    doc["age_s"] = round(age, 1)
    return doc
