"""The output canary's judgement (pairctl/sentinel/canary.py), the watchdog's monitor hook,
the watch flags, and how status shows the canary (pure: no HTTP). The acceptance probe's
monitor and status lines: tests/test_probe_schedule.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pairctl.gate.check import load_reference
from pairctl.sentinel import canary as cn
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
        MonitorConfig(canary_every_s=900, probe_every_s=0),
        probe=None,
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
    events = events_of(rec)
    assert len(events) == 1 and "error capital_en: timeout after 30s" in events[0]


def test_a_canary_run_that_raises_is_an_event(tmp_path: Path) -> None:
    def broken():
        raise ValueError("prompts file vanished")

    mon, lines = canary_monitor(broken, tmp_path)
    mon.after_ok_probe()
    assert len(lines) == 1 and lines[0].startswith("CANARY EVENT (no restart)")
    assert "could not run (ValueError: prompts file vanished)" in lines[0]
    assert events_of(read_record(tmp_path / "m.json"))


def test_the_canary_runs_on_its_schedule_not_at_every_probe(tmp_path: Path) -> None:
    clock = [0.0]
    runs: list[float] = []

    def canary():
        runs.append(clock[0])
        return cn.CanaryResult("t", [cn.CanaryVerdict("x", cn.GARBLE, "a loop", "aaaa", 0.1)])

    lines: list[str] = []
    mon = Monitors(
        MonitorConfig(canary_every_s=900, probe_every_s=0),
        probe=None,
        canary=canary,
        log=lines.append,
        record=tmp_path / "m.json",
        clock=lambda: clock[0],
    )
    for t in (0, 100, 899, 900, 1000):
        clock[0] = t
        mon.after_ok_probe()
    assert runs == [0, 900]
    assert sum(ln.startswith("CANARY EVENT (no restart)") for ln in lines) == 2
    assert read_record(tmp_path / "m.json")["canary"]["events"] == ["x"]


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


@pytest.mark.parametrize("bad", [["--canary-every", "5"], ["--probe-every", "30"]])
def test_watch_rejects_a_canary_that_would_load_the_pair(bad: list[str], tmp_path: Path) -> None:
    from pairctl.cli import main as cli

    assert cli.main(["watch", "--env-file", str(tmp_path / "none.env"), *bad]) == 2


def test_watch_takes_the_canary_and_probe_flags() -> None:
    from pairctl.cli.frontdoor import parse

    a = parse(["watch", "--canary-every", "0", "--probe-every", "300"])
    assert a.canary_every == 0 and a.probe_every == 300
    assert parse(["watch"]).canary_every == 900 and parse(["watch"]).probe_every == 900
    assert parse(["watch", "--probe-every", "0"]).probe_every == 0


RECORD = {
    "written_at": "2026-11-30T11:00:00Z",
    "age_s": 42.0,
    "canary": {
        "at": "2026-11-30T10:59:00Z",
        "verdicts": [
            {"name": "capital_zh", "kind": "drift", "detail": "answered in LATIN script"},
            {"name": "arithmetic", "kind": "ok", "detail": None},
        ],
    },
}


def test_status_shows_the_canary_watch_recorded() -> None:
    events = events_of(RECORD)
    assert len(events) == 1 and events[0].startswith("canary (recorded by watch 42 s ago")
    s = status_of((rank(0), rank(1)))
    s = type(s)(**{**s.__dict__, "watch_record": RECORD, "events": events})
    text = view.render_text(s)
    assert "output canary (recorded by watch, run 2026-11-30T10:59:00Z): 1/2 right; drift" in text
    assert "EVENT canary (recorded by watch 42 s ago" in text
    assert "HEALTHY" in text and s.exit_code == 0  # events do not change the verdict
    doc = json.loads(view.render_json(s))
    assert len(doc["events"]) == 1
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(view.render_rich(s))
    assert "EVENT canary" in out.getvalue()
