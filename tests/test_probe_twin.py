"""The acceptance probe against the simulator over loopback HTTP.

The twin's acceptance depends on what it is asked (a profile's ``accept_by_content``): the
probe's prompts get prose-, code- and agent-like profiles, and the traffic here has four
other shapes (an easy first token and hard later ones, uniformly low, steep, flat). A record
is made with ``sentinel record``; then:
- traffic of every shape, alone and mixed, before, during and between probe rounds never
  moves a judgement (a reading taken while traffic runs is dropped, not judged), while the
  live acceptance it shows on /metrics differs more than twofold between shapes;
- with ``--per-request-spec-decode-metrics`` the probe reads its own drafts under traffic;
- each field signature of a broken draft (sim/twin/draft_faults.py: dropped draft weights,
  the grammar profile, a position-0 collapse) fires, while the output text stays the same
  token for token.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from pairctl.endpoint import Endpoint, wait_ready
from pairctl.sentinel import probefile, record, recording
from pairctl.sentinel.monitors import MonitorConfig, Monitors
from pairctl.sentinel.probe import PER_REQUEST, load_set
from pairctl.sentinel.probeclient import ProbeClient
from pairctl.sentinel.schedule import ProbeSchedule
from pairctl.status import watch
from pairctl.status.metrics import figures
from tests.support.twin import REPO, Twin, free_port, metrics, wait_http

TRAFFIC = {  # marker word -> conditional acceptance per position
    "easyfirst": [0.95, 0.45, 0.40, 0.35, 0.30],
    "uniformlow": [0.40, 0.40, 0.40, 0.40, 0.40],
    "steep": [0.90, 0.70, 0.45, 0.25, 0.10],
    "flatshape": [0.80, 0.80, 0.80, 0.80, 0.80],
}
PROBES = {  # a word of each shipped probe prompt -> its profile
    "harbour": [0.62, 0.55, 0.50, 0.45, 0.42],  # prose
    "merge_intervals": [0.95, 0.90, 0.86, 0.82, 0.80],  # code
    "museums": [0.816, 0.763, 0.738, 0.722, 0.723],  # agent: 81.6/62.3/46.0/33.2/24.0%
}


def profile(tmp: Path) -> Path:
    rules = "".join(
        f'    - match: "{word}"\n      accept_prob_by_pos: {probs}\n'
        for word, probs in {**PROBES, **TRAFFIC}.items()
    )
    p = tmp / "shapes.yaml"
    p.write_text(
        f"""profile_version: 1
name: probe-test
base: {REPO / "sim" / "profiles" / "rehearsal.yaml"}
decode:
  step_ms_by_batch: {{1: 1.0, 16: 3.0}}
spec_decode:
  accept_prob_by_pos: [0.86, 0.78, 0.72, 0.67, 0.63]
  accept_by_content:
{rules}"""
    )
    return p


def start(tmp: Path, name: str, *extra: str) -> tuple[Twin, str]:
    port = free_port()
    args = ["m", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", str(profile(tmp))]
    args += ["--reasoning-parser", "deepseek_v4", "--tokenizer-mode", "deepseek_v4", *extra]
    twin = Twin(args, tmp, name)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", timeout=60)
    return twin, base


def complete(base: str, prompt: str, tokens: int = 200) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    r = requests.post(base + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text


def traffic(base: str, mix: dict[str, int]) -> None:
    prompts = [f"{word} request {i}" for word, n in mix.items() for i in range(n)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: complete(base, p), prompts))


def client(base: str) -> ProbeClient:
    ep = Endpoint.parse(base)
    s = ep.session(trust_env=False)
    return ProbeClient(s, ep, wait_ready(s, ep, 10, lambda _m: None).model, load_set())


def probe_reply(base: str) -> str:
    """The prose probe prompt's reply text (greedy): what the user would read."""
    spec = load_set().prompts[0]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": spec.prompt}],
        "temperature": 0,
        "max_tokens": 64,
        "chat_template_kwargs": {"thinking": False},
    }
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=60)
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory):
    """A healthy twin and the probe record made on it with ``sentinel record``."""
    tmp = tmp_path_factory.mktemp("healthy")
    twin, base = start(tmp, "healthy")
    out = tmp / "r.fork.unpinned.probe.json"
    try:
        assert record.main(["--url", base, "--out", str(out)]) == 0, twin.log()[-2000:]
        yield twin, base, out
    finally:
        twin.stop()


def test_the_record_says_how_it_was_made(healthy) -> None:
    _, base, out = healthy
    doc = json.loads(out.read_text())
    assert doc["recorded"]["simulator"] is True and doc["recorded"]["endpoint"] == base
    assert doc["recorded"]["repeats"] == 3 and doc["key"]["stack"] == "fork"
    classes = {c["name"]: c for c in doc["classes"]}
    assert set(classes) == {"prose", "code", "agent_json"}
    for c in classes.values():
        assert len(c["repeats"]) == 3 and c["method"] == "by-difference"
        assert all(d >= 16 for d in c["drafts"]) and c["spread"] == [0.0] * 5  # greedy
    # the prose prompt's record is its own profile, 62% then 55% of that, ...
    assert classes["prose"]["per_pos"][0] == pytest.approx(0.62, abs=0.03)
    assert classes["code"]["per_pos"][4] == pytest.approx(0.476, abs=0.04)


def monitors(base: str, record_file: Path, clock: list[float], seen: list | None = None):
    """watch's monitors on ``base`` with the record file; ``seen`` gets every reading."""
    c = client(base)

    def measure(p):
        got = c.measure(p)
        (seen if seen is not None else []).append(got)
        return got

    schedule = ProbeSchedule(
        900, list(c.probes.prompts), measure, lambda: probefile.load(record_file),
        lambda: clock[0],
    )  # fmt: skip
    lines: list[str] = []
    mon = Monitors(
        MonitorConfig(canary_every_s=0, probe_every_s=900),
        probe=schedule, canary=None, log=lines.append, clock=lambda: clock[0],
    )  # fmt: skip
    return mon, schedule, lines


def mean_length(base: str, mix: dict[str, int]) -> float:
    before = metrics(base)
    traffic(base, mix)
    f = figures(metrics(base), before, 1.0)
    assert f.mean_acceptance_length is not None
    return f.mean_acceptance_length


def test_healthy_traffic_of_every_shape_never_moves_the_probe(healthy) -> None:
    _, base, out = healthy
    shown = {w: mean_length(base, {w: 6}) for w in TRAFFIC}
    # 1.66, 2.63, 2.89, 3.69 tokens a verify step: what status shows moves with the traffic
    assert shown["uniformlow"] < 1.8 < shown["easyfirst"] < 2.76 < shown["steep"] < 3.2
    assert shown["flatshape"] > 3.5
    clock = [0.0]
    seen: list = []
    mon, schedule, lines = monitors(base, out, clock, seen)
    restarts: list[int] = []
    dog = watch.Watchdog(
        watch.WatchConfig(interval_s=30),
        probe=lambda: watch.probe_token(base, 10),
        restart=lambda: restarts.append(1) or 0,
        log=lines.append,
        after_ok=mon.after_ok_probe,
    )
    mixes = [{w: 4} for w in TRAFFIC] + [
        {"easyfirst": 3, "uniformlow": 3},
        {"steep": 2, "flatshape": 5, "uniformlow": 1},
        {"uniformlow": 8},
    ]
    rounds = 0
    for i, mix in enumerate(mixes):
        traffic(base, mix)  # between rounds
        due = schedule.next_due
        stop = threading.Event()

        def load(m: dict[str, int] = mix, halt: threading.Event = stop) -> None:
            while not halt.is_set():
                traffic(base, m)

        if i % 2:  # and during this round: its readings wait for an idle moment
            bg = threading.Thread(target=load, daemon=True)
            bg.start()
            for k in range(5):
                clock[0] = due + 30 * k
                dog.tick()
            stop.set()
            bg.join()
        clock[0] = due + 300
        dog.tick()
        assert schedule.started is None, "the round did not finish once the pair was idle"
        rounds += 1
    assert not restarts
    probe_lines = [ln for ln in lines if "acceptance probe" in ln.lower()]
    assert probe_lines and all("FAULT" not in ln and "ERROR" not in ln for ln in probe_lines)
    assert probe_lines == [probe_lines[0]] and probe_lines[0].startswith("acceptance probe ok")
    busy = [r for r in seen if getattr(r, "reason", None) == "busy"]
    judged = [r for r in seen if getattr(r, "method", None) == "by-difference"]
    assert len(judged) >= 3 * rounds and busy  # traffic ran during rounds and was kept out


def test_with_per_request_metrics_the_probe_reads_its_own_drafts_under_traffic(
    healthy, tmp_path: Path
) -> None:
    _, _, out = healthy
    twin, base = start(tmp_path, "per-request", "--per-request-spec-decode-metrics", "summary")
    try:
        rec = probefile.load(out)
        assert rec is not None
        c = client(base)
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                traffic(base, {"uniformlow": 4, "steep": 2})

        bg = threading.Thread(target=load, daemon=True)
        bg.start()
        try:
            time.sleep(0.2)
            readings = [c.measure(p) for p in c.probes.prompts for _ in range(2)]
        finally:
            stop.set()
            bg.join()
        assert all(getattr(r, "method", None) == PER_REQUEST for r in readings), readings
        verdicts = recording.check(c, rec, lambda _m: None, busy_wait_s=5)
        assert [v.state for v in verdicts] == ["ok", "ok", "ok"], [v.detail for v in verdicts]
    finally:
        twin.stop()


@pytest.mark.parametrize(
    ("fault", "where"),
    [
        ("draft-weights-dropped", "prose: below the floor at position 0"),
        ("draft-grammar", "code: below the floor at position 1"),
        ("draft-first-collapse", "prose: below the floor at position 0"),
    ],
)
def test_each_broken_draft_signature_fires_and_the_output_stays_the_same(
    healthy, tmp_path: Path, fault: str, where: str
) -> None:
    _, good, out = healthy
    twin, bad = start(tmp_path, fault, "--twin-fault", fault)
    try:
        assert probe_reply(bad) == probe_reply(good)  # the silent fault: same text
        clock = [0.0]
        mon, _, lines = monitors(bad, out, clock)
        mon.after_ok_probe()
        assert len(lines) == 1 and lines[0].startswith("ACCEPTANCE PROBE FAULT (no restart)")
        assert where in lines[0], lines[0]
        rec = probefile.load(out)
        assert rec is not None
        verdicts = recording.check(client(bad), rec, lambda _m: None)  # what up --gate runs
        assert any(v.event for v in verdicts)
    finally:
        twin.stop()


def pair_at(base: str, tmp: Path) -> SimpleNamespace:
    """What check_at_up reads of a resolved pair."""
    return SimpleNamespace(
        endpoint=base,
        api_key="",
        env_file=str(tmp / "pairs" / "pair-a.env"),
        recipe=SimpleNamespace(name="dsv4-flash-dspark"),
        stack=SimpleNamespace(name="fork"),
        model_revision="",
        plan_hash="abc123",
    )


def test_up_gate_records_a_new_key_then_judges_against_it(
    healthy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pairctl.cli import ops
    from pairctl.contracts import EXIT_GATE, EXIT_OK
    from pairctl.sentinel.pair import check_at_up, probe_record_path

    _, good, _ = healthy
    pair = pair_at(good, tmp_path)
    ok, line = check_at_up(pair, lambda _m: None)
    assert ok and line.startswith("acceptance probe recorded for stack fork"), line
    doc = json.loads(probe_record_path(pair).read_text())
    assert doc["recorded"]["plan_hash"] == "abc123" and doc["recorded"]["simulator"] is True
    first = probe_record_path(pair).read_text()
    ok, line = check_at_up(pair, lambda _m: None)
    assert ok and line.startswith("acceptance probe at its record (3 prompts"), line
    assert probe_record_path(pair).read_text() == first  # judged, not recorded again
    twin, bad = start(tmp_path, "grammar", "--twin-fault", "draft-grammar")
    try:
        broken = pair_at(bad, tmp_path)  # same key, same record: a draft that broke
        ok, line = check_at_up(broken, lambda _m: None)
        assert not ok and "acceptance probe FAULT against its record" in line, line
        assert "dspark sentinel record --env-file" in line
        monkeypatch.setattr(ops, "run_for_pair", lambda *a: EXIT_OK)  # the gate passed
        assert ops.gate(broken) == EXIT_GATE
        assert ops.gate(pair) == EXIT_OK
    finally:
        twin.stop()
