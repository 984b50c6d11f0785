"""The sentinel and canary for one resolved pair: where its baseline and monitor record
live, how its counters are read, and what ``status`` shows of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pairctl.endpoint import Endpoint
from pairctl.lifecycle.updown import lock_path
from pairctl.pair.resolved import ResolvedPair
from pairctl.sentinel import baseline
from pairctl.sentinel.acceptance import (
    DROP,
    INSUFFICIENT,
    Band,
    Counters,
    Reading,
    counters_of,
    judge,
)
from pairctl.sentinel.canary import EVENT_KINDS, run_against
from pairctl.sentinel.monitors import MonitorConfig, Monitors, read_record, record_path
from pairctl.status.metrics import Scrape, scrape


def baseline_path(pair: ResolvedPair) -> Path:
    return baseline.path_for(pair.recipe.path, pair.recipe.name)


def load_band(pair: ResolvedPair) -> Band | None:
    """The recipe's band; None without a baseline file (BaselineError when it is broken)."""
    return baseline.load(baseline_path(pair))


def monitor_record(pair: ResolvedPair) -> Path:
    return record_path(lock_path(pair), pair.pair_id, pair.spark1)


def pair_counters(pair: ResolvedPair) -> Counters | None:
    """The pair's spec-decode counters now (RuntimeError saying why when /metrics fails)."""
    sample, err = scrape(pair.endpoint, api_key=pair.api_key)
    if sample is None:
        raise RuntimeError(err)
    return counters_of(sample.scrape)


def pair_monitors(
    pair: ResolvedPair, canary_every_s: float, window_s: float, log: Callable[[str], None]
) -> Monitors:
    """``watch``'s monitors for this pair (the baseline is read again at every reading, so
    a newly recorded one applies without restarting the watchdog)."""
    ep = Endpoint.parse(pair.endpoint).with_auth(pair.api_key)
    return Monitors(
        MonitorConfig(canary_every_s=canary_every_s, window_s=window_s),
        counters=lambda: pair_counters(pair),
        band=lambda: load_band(pair),
        canary=(lambda: run_against(ep)) if canary_every_s else None,
        log=log,
        record=monitor_record(pair),
    )


def status_reading(
    pair: ResolvedPair, prev: Scrape | None, last: Scrape, interval: str
) -> tuple[Reading | None, str]:
    """What ``status`` judges: its own interval when that held enough drafts, else the
    counters since the server started. (reading, "") or (None, why there is none)."""
    try:
        band = load_band(pair)
    except baseline.BaselineError as exc:
        return None, str(exc)
    after = counters_of(last)
    if prev is not None:
        r = judge(counters_of(prev), after, band, interval)
        if r.state != INSUFFICIENT:
            return r, ""
    return judge(None, after, band, "since start"), ""


def watch_record(pair: ResolvedPair) -> dict[str, Any] | None:
    """What ``watch`` last recorded for this pair (None when nothing fresh)."""
    return read_record(monitor_record(pair))


def events_of(acceptance: dict[str, Any] | None, record: dict[str, Any] | None) -> list[str]:
    """The sentinel's and canary's events, one line each, for ``status``: its own reading
    first, then what ``watch`` recorded (its acceptance only when status has none to show)."""
    out = []
    if acceptance and acceptance.get("state") == DROP:
        out.append(f"acceptance drop: {acceptance['detail']} [{acceptance['window']}]")
    if record:
        ago = f"recorded by watch {record.get('age_s', 0):.0f} s ago"
        rec_acc = record.get("acceptance") or {}
        if rec_acc.get("state") == DROP and not out:
            out.append(
                f"acceptance drop ({ago}): {rec_acc.get('detail')} [{rec_acc.get('window')}]"
            )
        canary = record.get("canary") or {}
        bad = [v for v in canary.get("verdicts", []) if v.get("kind") in EVENT_KINDS]
        if bad:
            out.append(
                f"canary ({ago}, run {canary.get('at')}): "
                + "; ".join(f"{v['kind']} {v['name']}: {v.get('detail')}" for v in bad)
            )
    return out


def status_extras(
    pair: ResolvedPair, prev: Scrape | None, last: Scrape | None, window: str
) -> dict[str, Any]:
    """The fields ``status`` adds for the sentinel and canary (``PairStatus``'s
    ``acceptance``, ``watch_record`` and ``events``)."""
    acc: dict[str, Any] | None = None
    if last is not None:
        reading, err = status_reading(pair, prev, last, window)
        acc = reading.to_dict() if reading is not None else {"state": "error", "detail": err}
    rec = watch_record(pair)
    return {"acceptance": acc, "watch_record": rec, "events": events_of(acc, rec)}
