"""What ``watch`` does besides its token probe: the acceptance sentinel and the output canary.

Both run after a probe that succeeded (a pair that generates nothing is the restart
policy's business), and both only ever log: an acceptance drop, a bad canary reply or a
canary prompt that could not be judged (an error, the run itself failing included) is an
event line, never a reason to restart (a restart keeps the bad draft or image, and would
hide the cause). Each reading is also written to the pair's monitor record
(``record_path``), which ``status`` shows as "recorded by watch".

The sentinel's sliding window: every probe adds a snapshot of the spec-decode counters; the
judgement covers the counters since the newest snapshot at least ``window_s`` old, or an
older one (up to ``max_window_s``) when the window holds fewer drafts than the band's
minimum. With one snapshot (watch just started, or a counter reset emptied the window
because the server restarted) it covers the counters since the server started.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pairctl.contracts import ACCEPTANCE_WINDOW_S, CANARY_EVERY_S
from pairctl.sentinel.acceptance import DROP, Band, Counters, Reading, judge
from pairctl.sentinel.canary import CanaryResult, failed_run

DEFAULT_CANARY_EVERY_S = float(CANARY_EVERY_S)  # 4 runs an hour x 5 short greedy answers
DEFAULT_WINDOW_S = float(ACCEPTANCE_WINDOW_S)
DEFAULT_MAX_WINDOW_S = 3600.0
RECORD_FRESH_S = 3600.0  # status shows a record at most this old


@dataclass(frozen=True)
class MonitorConfig:
    canary_every_s: float = DEFAULT_CANARY_EVERY_S  # 0: no canary
    window_s: float = DEFAULT_WINDOW_S
    max_window_s: float = DEFAULT_MAX_WINDOW_S
    sentinel: bool = True


def record_path(lock_path: str, pair_id: str, spark1: str) -> Path:
    """The pair's monitor record, beside its launcher lock (same directory, same naming)."""
    return Path(lock_path).with_name(f"dsv4-monitor-{pair_id}-{spark1}.json")


def pick_base(
    samples: list[tuple[float, Counters]], now: float, window_s: float, min_drafts: float
) -> tuple[float, Counters] | None:
    """The snapshot the window starts at: the newest one at least ``window_s`` old, or an
    older one while the window holds fewer than ``min_drafts`` drafts. None: no snapshot is
    old enough yet (the window is then everything since the oldest); None with one snapshot
    (the caller then judges the counters since the server started)."""
    if len(samples) < 2:
        return None
    latest = samples[-1][1]
    older = [s for s in samples[:-1] if now - s[0] >= window_s] or [samples[0]]
    for t, c in reversed(older):
        if latest.minus(c).drafts >= min_drafts:
            return t, c
    return older[0]


class AcceptanceWindow:
    """Counter snapshots over the last ``max_window_s`` seconds."""

    def __init__(self, window_s: float, max_window_s: float) -> None:
        self.window_s, self.max_window_s = window_s, max(max_window_s, window_s)
        self.samples: deque[tuple[float, Counters]] = deque()

    def add(self, t: float, c: Counters) -> None:
        if self.samples and c.reset_since(self.samples[-1][1]):  # reset: a restarted pair
            self.samples.clear()
        self.samples.append((t, c))
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.max_window_s:
            self.samples.popleft()

    def reading(self, now: float, band: Band | None) -> Reading:
        latest = self.samples[-1][1] if self.samples else None
        need = band.min_drafts if band else 0
        base = pick_base(list(self.samples), now, self.window_s, need)
        if base is None:  # one snapshot (watch just started, or the server restarted)
            return judge(None, latest, band, "since the server started")
        return judge(base[1], latest, band, f"last {now - base[0]:.0f} s")


class Monitors:
    """The sentinel and the canary for one pair; every effect injected (unit-tested)."""

    def __init__(
        self,
        cfg: MonitorConfig,
        counters: Callable[[], Counters | None],
        band: Callable[[], Band | None],
        canary: Callable[[], CanaryResult] | None,
        log: Callable[[str], None],
        record: Path | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.cfg, self.counters, self.band, self.canary = cfg, counters, band, canary
        self.log, self.record = log, record
        self.clock = clock or time.monotonic
        self.window = AcceptanceWindow(cfg.window_s, cfg.max_window_s)
        self.last_state: str | None = None
        self.next_canary = self.clock()  # the first run right after the first good probe
        self.doc: dict[str, Any] = {}

    def after_ok_probe(self) -> None:
        """One sentinel reading, and the canary when it is due; log, record."""
        now = self.clock()
        if self.cfg.sentinel:
            self._sentinel(now)
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

    def _sentinel(self, now: float) -> None:
        try:
            c = self.counters()
            band = self.band()
        except Exception as exc:  # noqa: BLE001 - a reading that failed is logged, not fatal
            self.log(f"acceptance: no reading ({exc})")
            return
        if c is None:
            self.doc["acceptance"] = None
            return
        self.window.add(now, c)
        r = self.window.reading(now, band)
        self.doc["acceptance"] = r.to_dict()
        if r.state == self.last_state:
            return
        if r.state == DROP:
            self.log(f"ACCEPTANCE DROP (no restart): {r.detail} [{r.window}]")
        elif self.last_state == DROP:
            self.log(f"acceptance back in band: {r.detail} [{r.window}]")
        else:
            self.log(f"acceptance {r.state}: {r.detail} [{r.window}]")
        self.last_state = r.state

    def _write(self) -> None:
        if self.record is None:
            return
        doc = {
            "written_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
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
