"""The output canary's judgement (pairctl/sentinel/canary.py), the watchdog's monitor hook,
the watch flags, and how status shows the sentinel and canary (pure: no HTTP)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from pairctl.gate.check import load_reference
from pairctl.sentinel import canary as cn
from pairctl.sentinel.acceptance import DROP, Band, Counters
from pairctl.sentinel.monitors import MonitorConfig, Monitors, read_record
from pairctl.sentinel.pair import events_of
from pairctl.status import view, watch
from tests.test_status import rank, status_of

REF = load_reference(str(cn.CANARY_PROMPTS))
SPEC = {p["name"]: p for p in REF["prompts"]}


# Replies written here, not read from the prompts file: right answers as a model renders
# them (markdown emphasis, punctuation, case, a code fence), and wrong ones.
@pytest.mark.parametrize(
    "name, reply, kind",
    [
        ("arithmetic", "391", cn.OK),
        ("arithmetic", " `391`\n", cn.OK),
        ("arithmetic", "**391**", cn.OK),
        ("arithmetic", "391.", cn.OK),
        ("capital_en", "**Paris**", cn.OK),
        ("capital_en", "Paris.", cn.OK),
        ("capital_en", "paris", cn.OK),
        ("capital_en", "*PARIS*!", cn.OK),
        ("capital_en", '"Paris"', cn.OK),
        ("capital_en", "- Paris", cn.OK),
        ("capital_en", "Paris, France", cn.OK),  # accepted by the file
        ("capital_zh", "巴黎。", cn.OK),
        ("capital_zh", "**巴黎**", cn.OK),
        ("capital_zh", "巴黎市", cn.OK),
        ("capital_ru", "Токио", cn.OK),
        ("capital_ru", "ТОКИО.", cn.OK),
        ("code_output", "```\n15\n```", cn.OK),
        ("code_output", "`15`.", cn.OK),
        ("arithmetic", "392", cn.WRONG),
        ("arithmetic", "**392**", cn.WRONG),
        ("arithmetic", "-391", cn.WRONG),  # a sign is part of a number
        ("arithmetic", "391 (23 x 17)", cn.WRONG),
        ("capital_en", "Lyon", cn.WRONG),
        ("capital_en", "**Lyon**.", cn.WRONG),
        ("capital_en", "The capital of France is Paris.", cn.WRONG),  # not only the name
        ("code_output", "5", cn.WRONG),
        ("capital_en", "巴黎", cn.DRIFT),  # asked in English, answered in Chinese
        ("capital_en", "**巴黎**", cn.DRIFT),
        ("capital_zh", "Paris", cn.DRIFT),
        ("capital_ru", "东京", cn.DRIFT),
        ("arithmetic", "三百九十一", cn.DRIFT),  # the number must come back in digits
        ("capital_en", "Pa\ufffd\ufffdris", cn.GARBLE),
        ("capital_en", "the the the the the the the the", cn.GARBLE),
        ("capital_zh", "巴黎巴黎巴黎巴黎巴黎巴黎巴黎", cn.GARBLE),
        ("capital_en", "Par\x00\x01\x02\x03is", cn.GARBLE),
    ],
)
def test_a_reply_is_judged_right_wrong_garbled_or_drifted(name: str, reply: str, kind: str) -> None:
    got, why = cn.classify(SPEC[name], reply)
    assert got == kind, why
    assert (why is None) == (kind == cn.OK)


def test_every_canary_prompt_forgives_what_cannot_be_a_fault() -> None:
    """Greedy decoding repeats a reply: a prompt that rejects `**answer**` or `answer.`
    would raise the same false alarm at every run."""
    for p in REF["prompts"]:
        assert {"emphasis", "punctuation"} <= set(p.get("forgive", [])), p["name"]


def test_the_canary_set_is_the_gates_format_and_short() -> None:
    assert REF["max_tokens"] <= 64 and len(REF["prompts"]) <= 8
    assert {cn.dominant_script(p["answer"]) for p in REF["prompts"]} >= {"LATIN", "HAN", "CYRILLIC"}


def test_an_error_is_an_event_like_a_wrong_answer() -> None:
    answers = {
        "arithmetic": ("**391**", None),
        "capital_en": (None, "HTTP 500: boom"),
        "capital_zh": ("Paris", None),
        "capital_ru": (None, "the reply was all reasoning (32 tokens); raise max_tokens or ..."),
    }

    def ask(spec):
        return answers.get(spec["name"], ("zzz", None))

    res = cn.run(ask, REF)
    kinds = {v.name: v.kind for v in res.verdicts}
    assert kinds == {
        "arithmetic": cn.OK,
        "capital_en": cn.ERROR,
        "capital_zh": cn.DRIFT,
        "capital_ru": cn.ERROR,
        "code_output": cn.WRONG,
    }
    assert [v.name for v in res.events] == ["capital_en", "capital_zh", "capital_ru", "code_output"]
    doc = res.to_dict()
    assert doc["passed"] is False and doc["events"][0] == "capital_en"
    assert res.summary().startswith("canary: 1/5 right; ERROR capital_en: HTTP 500: boom")


def canary_monitor(canary, tmp_path: Path) -> tuple[Monitors, list[str]]:
    lines: list[str] = []
    mon = Monitors(
        MonitorConfig(canary_every_s=900, window_s=60, sentinel=False),
        counters=lambda: None,
        band=lambda: None,
        canary=canary,
        log=lines.append,
        record=tmp_path / "m.json",
        clock=lambda: 0.0,
    )
    return mon, lines


def test_a_canary_that_cannot_ask_is_an_event_in_the_log_and_in_status(tmp_path: Path) -> None:
    """Only errors, every answer that came back right: still an event, never silence."""
    timeout = cn.CanaryVerdict("capital_en", cn.ERROR, "timeout after 30s", None, 30.0)
    right = cn.CanaryVerdict("arithmetic", cn.OK, None, "391", 0.1)
    mon, lines = canary_monitor(lambda: cn.CanaryResult("t", [right, timeout]), tmp_path)
    mon.after_ok_probe()
    assert lines == [
        "CANARY EVENT (no restart): canary: 1/2 right; ERROR capital_en: timeout after 30s"
    ]
    rec = read_record(tmp_path / "m.json")
    assert rec["canary"]["passed"] is False and rec["canary"]["events"] == ["capital_en"]
    events = events_of(None, rec)
    assert len(events) == 1 and "error capital_en: timeout after 30s" in events[0]


def test_a_canary_run_that_raises_is_an_event(tmp_path: Path) -> None:
    def broken():
        raise ValueError("prompts file vanished")

    mon, lines = canary_monitor(broken, tmp_path)
    mon.after_ok_probe()
    assert len(lines) == 1 and lines[0].startswith("CANARY EVENT (no restart)")
    assert "could not run (ValueError: prompts file vanished)" in lines[0]
    assert events_of(None, read_record(tmp_path / "m.json"))


C = [0.81, 0.62, 0.46, 0.33, 0.24]
BAND = Band(5, 0.78, 0.4, [0.0, 0.65, 0.63, 0.61, 0.62], (3.0, 3.6), 1000, 200)


def cnt(per_pos: list[float], drafts: float) -> Counters:
    a = tuple(drafts * p for p in per_pos)
    return Counters(drafts, 5 * drafts, sum(a), a)


def plus(a: Counters, b: Counters) -> Counters:
    return Counters(
        a.drafts + b.drafts,
        a.draft_tokens + b.draft_tokens,
        a.accepted + b.accepted,
        tuple(x + y for x, y in zip(a.per_pos, b.per_pos, strict=True)),
    )


def test_monitors_log_state_changes_once_and_write_the_record(tmp_path: Path) -> None:
    bad = [0.6, 0.2, 0.08, 0.03, 0.01]
    snaps = iter(
        [
            cnt(C, 0),  # t=0: nothing drafted yet
            cnt(C, 5000),  # t=100: healthy
            cnt(C, 6000),  # t=200: healthy
            cnt(bad, 3000),  # t=300: counters went down: restarted, with the weights gone
            cnt(bad, 6000),  # t=400: still bad
            plus(cnt(bad, 6000), cnt(C, 5000)),  # t=1000: fixed (no restart seen)
        ]
    )
    lines: list[str] = []
    clock = [0.0]
    rec = tmp_path / "m.json"
    runs = []

    def canary():
        runs.append(clock[0])
        return cn.CanaryResult("t", [cn.CanaryVerdict("x", cn.GARBLE, "a loop", "aaaa", 0.1)])

    mon = Monitors(
        MonitorConfig(canary_every_s=900, window_s=60),
        counters=lambda: next(snaps),
        band=lambda: BAND,
        canary=canary,
        log=lines.append,
        record=rec,
        clock=lambda: clock[0],
    )
    for t in (0, 100, 200, 300, 400, 1000):
        clock[0] = t
        mon.after_ok_probe()
    assert runs == [0, 1000]  # the canary on its schedule, not at every probe
    assert sum(ln.startswith("CANARY EVENT (no restart)") for ln in lines) == 2
    acc = [ln for ln in lines if "canary" not in ln.lower()]
    assert [ln.split(":")[0] for ln in acc] == [
        "acceptance insufficient",
        "acceptance ok",
        "ACCEPTANCE DROP (no restart)",  # logged once, at the change
        "acceptance back in band",
    ]
    assert acc[2].endswith("[since the server started]")  # the restart emptied the window
    assert acc[3].endswith("[last 600 s]")
    assert read_record(rec)["canary"]["events"] == ["x"]
    assert read_record(rec)["acceptance"]["state"] == "ok"


def test_the_record_is_ignored_when_stale(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"written_at": "2020-01-01T00:00:00Z", "canary": {}}))
    assert read_record(p) is None
    p.write_text("{not json")
    assert read_record(p) is None


def test_the_watchdog_runs_the_monitors_after_good_probes_only_and_survives_them() -> None:
    probes = iter([None, "HTTP 500", None, None])
    calls, lines, restarts = [], [], []

    def after_ok():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")

    dog = watch.Watchdog(
        watch.WatchConfig(interval_s=10, failures=3),
        probe=lambda: next(probes),
        restart=lambda: restarts.append(1) or 0,
        log=lines.append,
        after_ok=after_ok,
    )
    for _ in range(4):
        assert dog.tick() == 10
    assert len(calls) == 3 and not restarts
    assert any("monitors failed this round (RuntimeError: boom); no restart" in ln for ln in lines)


@pytest.mark.parametrize("bad", [["--canary-every", "5"], ["--acceptance-window", "0"]])
def test_watch_rejects_a_canary_that_would_load_the_pair(bad: list[str], tmp_path: Path) -> None:
    from pairctl.cli import main as cli

    assert cli.main(["watch", "--env-file", str(tmp_path / "none.env"), *bad]) == 2


def test_watch_takes_the_canary_and_window_flags() -> None:
    from pairctl.cli.frontdoor import parse

    a = parse(["watch", "--canary-every", "0", "--acceptance-window", "300"])
    assert a.canary_every == 0 and a.acceptance_window == 300
    assert parse(["watch"]).canary_every == 900


DROP_READING = {
    "state": DROP,
    "detail": "depth ratio 0.59 below the band floor 0.78: later draft positions collapse",
    "window": "last 600 s",
}
RECORD = {
    "written_at": "2026-11-30T11:00:00Z",
    "age_s": 42.0,
    "acceptance": {"state": "ok", "detail": "in band", "window": "last 600 s"},
    "canary": {
        "at": "2026-11-30T10:59:00Z",
        "verdicts": [
            {"name": "capital_zh", "kind": "drift", "detail": "answered in LATIN script"},
            {"name": "arithmetic", "kind": "ok", "detail": None},
        ],
    },
}


def test_status_shows_the_sentinel_and_the_canary_watch_recorded() -> None:
    events = events_of(DROP_READING, RECORD)
    assert events[0].startswith("acceptance drop: depth ratio 0.59")
    assert events[1].startswith("canary (recorded by watch 42 s ago")
    s = status_of((rank(0), rank(1)))
    s = type(s)(
        **{**s.__dict__, "acceptance": DROP_READING, "watch_record": RECORD, "events": events}
    )
    text = view.render_text(s)
    assert "acceptance sentinel: DROP: depth ratio 0.59" in text
    assert "output canary (recorded by watch, run 2026-11-30T10:59:00Z): 1/2 right; drift" in text
    assert "EVENT canary (recorded by watch 42 s ago" in text
    assert "HEALTHY" in text and s.exit_code == 0  # events do not change the verdict
    doc = json.loads(view.render_json(s))
    assert doc["acceptance"]["state"] == "drop" and len(doc["events"]) == 2
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(view.render_rich(s))
    assert "EVENT acceptance drop" in out.getvalue()


def test_status_says_how_to_record_a_missing_baseline() -> None:
    s = status_of((rank(0), rank(1)))
    s = type(s)(**{**s.__dict__, "acceptance": {"state": "no-baseline", "detail": "none"}})
    assert "python -m pairctl.sentinel record" in view.render_text(s)


def scrape_of(c: Counters):
    from pairctl.status.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFTS, Scrape

    per = [({"position": str(k)}, v) for k, v in enumerate(c.per_pos)]
    return Scrape({DRAFTS: [({}, c.drafts)], ACCEPTED: [({}, c.accepted)], ACCEPTED_PER_POS: per})


def test_status_judges_its_interval_else_since_start_and_shows_watchs_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from pairctl.sentinel import baseline
    from pairctl.sentinel.pair import monitor_record, status_extras

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    recipe = SimpleNamespace(path=str(tmp_path / "recipes" / "r.yaml"), name="r")
    pair = SimpleNamespace(recipe=recipe, pair_id="pair-a", spark1="10.0.0.1")
    old = cnt(C, 100_000)
    new = plus(old, cnt([0.6, 0.2, 0.08, 0.03, 0.01], 3000))
    got = status_extras(pair, scrape_of(old), scrape_of(new), "last 60.0 s")
    assert got["acceptance"]["state"] == "no-baseline" and got["events"] == []
    path = baseline.path_for(recipe.path, recipe.name)
    baseline.save(path, baseline.document("r", BAND, 0.15, {}))
    got = status_extras(pair, scrape_of(old), scrape_of(new), "last 60.0 s")
    assert got["acceptance"]["state"] == DROP and got["acceptance"]["window"] == "last 60.0 s"
    assert got["events"][0].startswith("acceptance drop: depth ratio")
    quiet = status_extras(pair, scrape_of(new), scrape_of(new), "last 1.0 s")  # no drafts
    assert quiet["acceptance"]["window"] == "since start"  # diluted over 103000 drafts: ok
    assert quiet["acceptance"]["state"] == "ok" and quiet["watch_record"] is None
    rec = {**RECORD, "written_at": datetime.now(UTC).isoformat()}
    monitor_record(pair).write_text(json.dumps(rec))
    got = status_extras(pair, None, scrape_of(new), "since start")
    assert got["watch_record"]["canary"]["at"] == "2026-11-30T10:59:00Z"
    assert [e.split(" (")[0] for e in got["events"]] == ["canary"]
    path.write_text("{")
    broken = status_extras(pair, None, scrape_of(new), "since start")["acceptance"]
    assert broken["state"] == "error" and "record it again" in broken["detail"]
