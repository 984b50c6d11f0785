"""The acceptance probe and canary for one resolved pair: its record key and file, its
monitor record, ``watch``'s monitors, the check ``up --gate`` runs, and what ``status``
shows of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pairctl.contracts import PROBE_REPEATS
from pairctl.endpoint import Endpoint, NotReady, wait_ready
from pairctl.lifecycle.updown import lock_path
from pairctl.pair.resolved import ResolvedPair
from pairctl.sentinel import probefile, recording
from pairctl.sentinel.canary import EVENT_KINDS, run_against
from pairctl.sentinel.judgement import FAULT, Margins
from pairctl.sentinel.monitors import MonitorConfig, Monitors, read_record, record_path
from pairctl.sentinel.probe import Measurement, ProbePrompt, Skip, load_set
from pairctl.sentinel.probeclient import ProbeClient
from pairctl.sentinel.probefile import ProbeKey, ProbeRecord
from pairctl.sentinel.schedule import EVENT_STATES, ProbeSchedule
from pairctl.status.metrics import DRAFTS

PROBES_DIR = "probes"
# At `up --gate` a reading waits this long for an idle pair (clients already on a fresh
# pair): then the probe is a warning, and watch takes it on its schedule.
UP_BUSY_WAIT_S = 60.0


def key_of(pair: ResolvedPair) -> ProbeKey:
    """What the pair's probe record is valid for: its engine stack (pairctl.engine.stack),
    recipe and checkpoint revision."""
    return ProbeKey(pair.recipe.name, pair.stack.name, pair.model_revision)


def probe_record_path(pair: ResolvedPair) -> Path:
    """``probes/<key>.probe.json`` beside the pair's env file (shared by a fleet's pairs)."""
    return probefile.path_in(Path(pair.env_file).resolve().parent / PROBES_DIR, key_of(pair))


def load_record(pair: ResolvedPair) -> ProbeRecord | None:
    """The pair's probe record; None without one (ProbeFileError when it is broken)."""
    return probefile.load(probe_record_path(pair))


def monitor_record(pair: ResolvedPair) -> Path:
    return record_path(lock_path(pair), pair.pair_id, pair.spark1)


def client_for(pair: ResolvedPair, ready_timeout_s: float = 30.0) -> tuple[ProbeClient, bool]:
    """A probe client on the pair's endpoint (its key, no proxy, the first model served) and
    whether the endpoint is the simulator; NotReady when it lists no model in time."""
    ep = Endpoint.parse(pair.endpoint).with_auth(pair.api_key)
    s = ep.session(trust_env=False)
    key_from = f"VLLM_API_KEY in {pair.env_file}"
    ident = wait_ready(s, ep, ready_timeout_s, lambda _m: None, key_from=key_from)
    return ProbeClient(s, ep, ident.model, load_set()), ident.simulator


class _LazyMeasure:
    """The probe client, made at the first reading (the endpoint may not be ready when
    ``watch`` starts) and again after a reading raised."""

    def __init__(self, pair: ResolvedPair) -> None:
        self.pair = pair
        self.client: ProbeClient | None = None

    def __call__(self, prompt: ProbePrompt) -> Measurement | Skip:
        if self.client is None:
            self.client = client_for(self.pair)[0]
        try:
            return self.client.measure(prompt)
        except Exception:
            self.client = None
            raise


def pair_monitors(
    pair: ResolvedPair, canary_every_s: float, probe_every_s: float, log: Callable[[str], None]
) -> Monitors:
    """``watch``'s monitors for this pair (the record is read again at every round, so a
    newly recorded one applies without restarting the watchdog)."""
    import time

    ep = Endpoint.parse(pair.endpoint).with_auth(pair.api_key)
    schedule = None
    if probe_every_s:
        schedule = ProbeSchedule(
            probe_every_s,
            list(load_set().prompts),
            _LazyMeasure(pair),
            lambda: load_record(pair),
            time.monotonic,
        )
    return Monitors(
        MonitorConfig(canary_every_s=canary_every_s, probe_every_s=probe_every_s),
        probe=schedule,
        canary=(lambda: run_against(ep)) if canary_every_s else None,
        log=log,
        record=monitor_record(pair),
    )


def check_at_up(pair: ResolvedPair, log: Callable[[str], None]) -> tuple[bool, str]:
    """After ``up``'s quality gate passed: record the probe where the pair's key has no
    record yet (the pair was just shown good), else judge one reading of each prompt against
    the record. (ok, one line to print): not ok only for a FAULT against a record; a probe
    that could not be taken or read is a warning (the gate passed; ``watch`` probes again)."""
    try:
        rec = load_record(pair)
        client, simulator = client_for(pair)
        if rec is None and client.metrics().total(DRAFTS) is None:
            return True, "acceptance probe: the server does not draft (no spec-decode counters)"
        if rec is None:
            margins = Margins()
            prompts = recording.take(client, PROBE_REPEATS, margins, log, UP_BUSY_WAIT_S)
            doc = recording.recorded_doc(
                client, key_of(pair), prompts, margins, PROBE_REPEATS, simulator, pair.plan_hash
            )
            path = probe_record_path(pair)
            recording.write(path, doc)
            return True, (
                f"acceptance probe recorded for {key_of(pair).label()} (no record yet): {path}: "
                + recording.summary(prompts)
            )
        verdicts = recording.check(client, rec, log, UP_BUSY_WAIT_S)
    except (recording.RecordFailed, ValueError, NotReady, OSError) as exc:  # parse errors too
        return True, f"WARN: acceptance probe not taken ({exc}); watch probes on its schedule"
    bad = [v for v in verdicts if v.state == FAULT]
    if bad:
        return False, (
            "acceptance probe FAULT against its record "
            f"{rec.path}: " + "; ".join(v.detail for v in bad) + ". If the change is intended, "
            "record it again: dspark sentinel record --env-file " + pair.env_file
        )
    return True, f"acceptance probe at its record ({len(verdicts)} prompts, {rec.path})"


def watch_record(pair: ResolvedPair) -> dict[str, Any] | None:
    """What ``watch`` last recorded for this pair (None when nothing fresh)."""
    return read_record(monitor_record(pair))


def events_of(record: dict[str, Any] | None) -> list[str]:
    """The probe's and canary's events in ``watch``'s monitor record, one line each."""
    out: list[str] = []
    if not record:
        return out
    ago = f"recorded by watch {record.get('age_s', 0):.0f} s ago"
    probe = record.get("probe") or {}
    if probe.get("state") in EVENT_STATES:
        when = f"{ago}, round {probe.get('at')}"
        out.append(f"acceptance probe {probe['state']} ({when}): {probe.get('detail')}")
    canary = record.get("canary") or {}
    bad = [v for v in canary.get("verdicts", []) if v.get("kind") in EVENT_KINDS]
    if bad:
        out.append(
            f"canary ({ago}, run {canary.get('at')}): "
            + "; ".join(f"{v['kind']} {v['name']}: {v.get('detail')}" for v in bad)
        )
    return out


def probe_state(pair: ResolvedPair, record: dict[str, Any] | None) -> dict[str, Any]:
    """``status``'s ``acceptance``: the probe's last round as watch recorded it, and whether
    a probe record exists for the pair's key (status itself sends no probe)."""
    key = key_of(pair)
    out: dict[str, Any] = {"key": key.to_dict(), "record": str(probe_record_path(pair))}
    try:
        rec = load_record(pair)
    except probefile.ProbeFileError as exc:
        return {**out, "state": "error", "detail": str(exc)}
    if rec is None:
        return {
            **out,
            "record": None,
            "state": "no-record",
            "detail": f"no probe record for {key.label()} (up --gate records one; or dspark "
            f"sentinel record --env-file {pair.env_file})",
        }
    probe = (record or {}).get("probe")
    if not probe:
        return {
            **out,
            "state": "not-run",
            "detail": "no probe round recorded by watch in the last hour",
        }
    return {**out, **probe, "age_s": (record or {}).get("age_s")}


def status_extras(pair: ResolvedPair) -> dict[str, Any]:
    """The fields ``status`` adds for the probe and canary (``PairStatus``'s ``acceptance``,
    ``watch_record`` and ``events``)."""
    rec = watch_record(pair)
    return {"acceptance": probe_state(pair, rec), "watch_record": rec, "events": events_of(rec)}
