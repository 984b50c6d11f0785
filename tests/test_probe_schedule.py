"""watch's acceptance probe rounds (pairctl/sentinel/schedule.py), the monitors' log lines
and record, and what status shows of them (pairctl/sentinel/pair.py, render.py): pure, on a
pretend server's counters (tests/support/fake_spec.py)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pairctl.sentinel import probefile
from pairctl.sentinel.judgement import summarise
from pairctl.sentinel.monitors import MonitorConfig, Monitors, read_record
from pairctl.sentinel.probe import Measurement, ProbePrompt, measure
from pairctl.sentinel.probefile import ProbeKey, ProbeRecord
from pairctl.sentinel.schedule import ProbeSchedule
from pairctl.status import view, watch
from sim.twin.draft_faults import DraftFault
from tests.support.fake_spec import FakeServer, cum
from tests.test_status import rank, status_of

CODE = [0.95, 0.90, 0.86, 0.82, 0.80]
PROSE = [0.62, 0.55, 0.50, 0.45, 0.42]
PROMPTS = [ProbePrompt("prose", "prose", "p"), ProbePrompt("code", "code", "c")]
KEY = ProbeKey("r", "fork", "")


def healthy() -> dict[str, list[float]]:
    return {"prose": cum(PROSE), "code": cum(CODE)}


def exact(name: str, marginals: list[float]) -> Measurement:
    return Measurement(name, 1000, tuple(round(1000 * m) for m in marginals), 0, "x", 0.0)


def a_record() -> ProbeRecord:
    prompts = {n: summarise(n, n, [exact(n, m)] * 3) for n, m in healthy().items()}
    return ProbeRecord(KEY, prompts, {}, Path("/records/r.fork.unpinned.probe.json"))


class Rig:
    """A schedule on a pretend server, a clock, and the monitors around it."""

    def __init__(self, tmp_path: Path, server: FakeServer, record=a_record) -> None:
        self.server, self.t, self.lines = server, [0.0], []
        self.schedule = ProbeSchedule(
            900,
            PROMPTS,
            lambda p: measure(p, server.scrape, server.ask, 16, sleep=lambda _s: None),
            record,
            lambda: self.t[0],
        )
        self.record_path = tmp_path / "monitor.json"
        self.mon = Monitors(
            MonitorConfig(canary_every_s=0, probe_every_s=900),
            probe=self.schedule,
            canary=None,
            log=self.lines.append,
            record=self.record_path,
            clock=lambda: self.t[0],
        )

    def at(self, t: float) -> None:
        self.t[0] = t
        self.mon.after_ok_probe()


def test_a_healthy_round_is_ok_and_logged_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, FakeServer(healthy(), drafts_per_probe=300, seed=1))
    for t in (0, 30, 60, 900, 1800):
        rig.at(t)
    assert rig.lines == [
        "acceptance probe ok: 2 prompt(s) at or above their record's floors "
        "[stack fork, recipe r, revision unpinned]"
    ]
    assert rig.server.asked == 6  # a round at 0, 900 and 1800; none between
    rec = read_record(rig.record_path)
    assert rec["probe"]["state"] == "ok" and len(rec["probe"]["verdicts"]) == 2


def test_a_broken_draft_is_a_fault_event_every_round_and_the_fix_is_logged(tmp_path: Path):
    rig = Rig(tmp_path, FakeServer(healthy(), drafts_per_probe=300, seed=2))
    rig.at(0)
    broken = {n: cum(DraftFault("draft-weights-dropped").apply(c)) for n, c in
              (("prose", PROSE), ("code", CODE))}  # fmt: skip
    rig.server.profiles = broken
    rig.at(900)
    rig.at(1800)
    rig.server.profiles = healthy()
    rig.at(2700)
    assert [ln.split(":")[0] for ln in rig.lines] == [
        "acceptance probe ok",
        "ACCEPTANCE PROBE FAULT (no restart)",
        "ACCEPTANCE PROBE FAULT (no restart)",  # every round, while it lasts
        "acceptance probe back at its record",
    ]
    assert "prose: below the floor at position 0" in rig.lines[1]
    assert "code: below the floor at position" in rig.lines[1]
    assert rig.server.asked == 2 + 2 * 4 + 2  # each FAULT read twice before it counts


def test_one_reading_below_the_floor_that_the_second_does_not_repeat_is_ok(tmp_path) -> None:
    server = FakeServer(healthy(), drafts_per_probe=300, seed=3)
    rig = Rig(tmp_path, server)
    real_ask = server.ask
    calls = []

    def ask_once_bad(p):
        calls.append(p.name)
        if len(calls) == 1:  # the first prose reading comes from a broken moment
            server.profiles = {**healthy(), "prose": cum([0.05] * 5)}
        else:
            server.profiles = healthy()
        return real_ask(p)

    server.ask = ask_once_bad
    rig.at(0)
    assert calls == ["prose", "prose", "code"]
    assert rig.lines[0].startswith("acceptance probe ok")
    verdicts = read_record(rig.record_path)["probe"]["verdicts"]
    assert verdicts[0]["note"].startswith("not confirmed: prose: below the floor at position 0")


def test_a_busy_pair_is_read_later_and_a_round_never_idle_is_not_judged(tmp_path) -> None:
    server = FakeServer(healthy(), drafts_per_probe=300, seed=4, running=1)
    rig = Rig(tmp_path, server)
    for t in (0, 30, 60):
        rig.at(t)
    assert server.asked == 0 and rig.lines == []  # waiting for an idle pair, silently
    server.running = 0
    server.during = [(cum([0.3] * 5), 50)]  # traffic arrives during every reading
    rig.at(90)
    assert server.asked == 1 and rig.lines == []
    rig.at(900)  # the round started at 0: given up after every_s
    assert rig.lines[0].startswith("acceptance probe not judged: prose, code not read")
    assert "--per-request-spec-decode-metrics" in rig.lines[0]
    server.during = []
    rig.at(1800)
    assert rig.lines[-1].startswith("acceptance probe ok")


def test_a_pair_that_stopped_drafting_is_a_fault(tmp_path: Path) -> None:
    server = FakeServer(healthy())
    rig = Rig(tmp_path, server)
    server.scrape = lambda: probefile_scrape_without_spec()  # type: ignore[method-assign]
    rig.at(0)
    assert rig.lines[0].startswith("ACCEPTANCE PROBE FAULT (no restart): prose: the server ")
    assert "no longer drafts" in rig.lines[0] and "5 draft positions" in rig.lines[0]


def probefile_scrape_without_spec():
    from pairctl.status.metrics import RUNNING, Scrape

    return Scrape({RUNNING: [({}, 0.0)]})


def test_an_error_is_an_event_and_a_raising_probe_too(tmp_path: Path) -> None:
    server = FakeServer(healthy())
    rig = Rig(tmp_path, server)
    asked = []
    server.ask = lambda p: asked.append(p.name) or "POST /v1/chat/completions: HTTP 500: boom"  # type: ignore[method-assign]
    rig.at(0)
    assert rig.lines[0].startswith("ACCEPTANCE PROBE ERROR (no restart): prose not read (error)")
    assert asked == ["prose"]  # the round ends at the first failed request
    rig2 = Rig(tmp_path, server, record=lambda: (_ for _ in ()).throw(OSError("disk gone")))
    rig2.at(0)
    assert rig2.lines[0].startswith("ACCEPTANCE PROBE ERROR (no restart): the probe could not")
    assert rig2.schedule.started is None  # the next tick starts a fresh round


def test_no_record_is_said_once_and_a_new_record_applies_without_a_restart(tmp_path) -> None:
    holder: list[ProbeRecord | None] = [None]
    rig = Rig(tmp_path, FakeServer(healthy(), drafts_per_probe=300), record=lambda: holder[0])
    rig.at(0)
    rig.at(900)
    assert rig.lines == ["acceptance probe no-record: no probe record for this pair's key"]
    holder[0] = a_record()
    rig.at(1800)
    assert rig.lines[-1].startswith("acceptance probe ok")


def test_the_watchdog_never_restarts_for_a_probe_fault(tmp_path: Path) -> None:
    broken = {"prose": cum([0.05] * 5), "code": cum([0.05] * 5)}
    rig = Rig(tmp_path, FakeServer(broken, drafts_per_probe=300))
    restarts = []
    dog = watch.Watchdog(
        watch.WatchConfig(interval_s=30, failures=1),
        probe=lambda: None,
        restart=lambda: restarts.append(1) or 0,
        log=rig.lines.append,
        after_ok=rig.mon.after_ok_probe,
    )
    for _ in range(3):
        dog.tick()
    assert not restarts and any("ACCEPTANCE PROBE FAULT (no restart)" in x for x in rig.lines)


# -- status ------------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return SimpleNamespace(
        recipe=SimpleNamespace(name="r"),
        stack=SimpleNamespace(name="fork"),
        env_file=str(tmp_path / "pairs" / "pair-a.env"),
        pair_id="pair-a",
        spark1="10.0.0.1",
        model_revision="",
    )


def test_status_says_when_there_is_no_record_and_how_to_make_one(pair) -> None:
    from pairctl.sentinel.pair import probe_record_path, status_extras

    got = status_extras(pair)
    assert got["acceptance"]["state"] == "no-record" and got["events"] == []
    assert "up --gate records one" in got["acceptance"]["detail"]
    assert probe_record_path(pair) == Path(pair.env_file).parent / "probes" / (
        "r.fork.unpinned.probe.json"
    )


def test_status_shows_watchs_last_round_and_its_fault_as_an_event(pair) -> None:
    from pairctl.sentinel.pair import monitor_record, probe_record_path, status_extras

    rec = a_record()
    doc = probefile.document(KEY, list(rec.prompts.values()), {}, {"at": "t"})
    probefile.save(probe_record_path(pair), doc)
    assert status_extras(pair)["acceptance"]["state"] == "not-run"
    round_ = {
        "state": "fault",
        "detail": "code: below the floor at position 1: 95/31/...",
        "at": "2026-11-30T10:59:00Z",
        "key": KEY.label(),
    }
    written = datetime.now(UTC).isoformat()
    monitor_record(pair).write_text(json.dumps({"written_at": written, "probe": round_}))
    got = status_extras(pair)
    assert got["acceptance"]["state"] == "fault"
    assert got["events"][0].startswith("acceptance probe fault (recorded by watch")
    s = status_of((rank(0), rank(1)))
    s = type(s)(**{**s.__dict__, **got})
    text = view.render_text(s)
    assert "acceptance probe (recorded by watch 0 s ago, round 2026-11-30T10:59:00Z): FAULT" in text
    assert "EVENT acceptance probe fault" in text and s.exit_code == 0
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(view.render_rich(s))
    assert "EVENT acceptance probe fault" in out.getvalue()
    probe_record_path(pair).write_text("{")
    assert status_extras(pair)["acceptance"]["state"] == "error"
