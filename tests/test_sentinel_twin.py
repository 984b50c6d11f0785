"""The acceptance sentinel and output canary against the simulator over loopback HTTP.

Three kinds of traffic with different predictability (prose, agent, code: mean acceptance
lengths ~2.2 / 3.5 / 4.6, a profile's ``accept_by_content`` rules), a baseline recorded
with ``python -m pairctl.sentinel record`` (the gate's prompts, then live traffic), then:
- the fault ``draft-decay`` (later draft positions collapse, the output text is the same
  token for token) fires the sentinel;
- a change of traffic mix alone (prose only, code only) does not;
- ``watch``'s monitors log the drop and a bad canary as events and never restart.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from pairctl.endpoint import Endpoint
from pairctl.sentinel import baseline, record
from pairctl.sentinel.acceptance import DROP, OK, counters_of, judge
from pairctl.sentinel.canary import run_against
from pairctl.sentinel.monitors import MonitorConfig, Monitors, read_record
from pairctl.sentinel.pair import events_of
from pairctl.sentinel.render import lines
from pairctl.status import watch
from tests.support.twin import REPO, Twin, free_port, metrics, wait_http

MIN_DRAFTS = 400
KINDS = {
    "prose": "Write a short story about the sea, part {i}.",
    "agent": "Call the search tool for step {i} and report.",
    "code": "Write Python code that solves task {i}.",
}


def profile(tmp: Path) -> Path:
    """The rehearsal profile with fast verify steps and acceptance by content."""
    p = tmp / "content.yaml"
    base = REPO / "sim" / "profiles" / "rehearsal.yaml"
    gate = REPO / "pairctl" / "gate"
    p.write_text(
        f"""profile_version: 1
name: sentinel-test
base: {base}
decode:
  step_ms_by_batch: {{1: 1.0, 16: 3.0}}
spec_decode:
  accept_prob_by_pos: [0.86, 0.78, 0.72, 0.67, 0.63]
  accept_by_content:
    - match: "(?i)story|essay"
      accept_prob_by_pos: [0.62, 0.55, 0.50, 0.45, 0.42]
    - match: "(?i)python|code"
      accept_prob_by_pos: [0.95, 0.90, 0.86, 0.82, 0.80]
answers:
  file: [{gate / "quality_ref_dspark.json"}, {gate / "canary_dspark.json"}]
"""
    )
    return p


def start(tmp: Path, name: str, fault: str = "") -> tuple[Twin, str]:
    port = free_port()
    args = ["m", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", str(profile(tmp))]
    # the recipe's parser: thinking replies come split into reasoning and content
    args += ["--reasoning-parser", "deepseek_v4", "--tokenizer-mode", "deepseek_v4"]
    if fault:
        args += ["--twin-fault", fault]
    twin = Twin(args, tmp, name)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", timeout=60)
    return twin, base


def complete(base: str, prompt: str, tokens: int = 300) -> str:
    r = requests.post(
        base + "/v1/completions",
        json={
            "model": "m",
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def traffic(base: str, mix: dict[str, int], tokens: int = 300) -> None:
    prompts = [KINDS[k].format(i=i) for k, n in mix.items() for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: complete(base, p, tokens), prompts))


def window(base: str, mix: dict[str, int], band: baseline.Band | None):
    before = counters_of(metrics(base))
    traffic(base, mix)
    return judge(before, counters_of(metrics(base)), band, "test window")


def record_band(base: str, out: Path) -> int:
    """``python -m pairctl.sentinel record`` while live traffic (mostly agent turns) runs."""
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            traffic(base, {"agent": 6, "code": 1, "prose": 1})

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(load)
        try:
            return record.main(
                [
                    "--url", base, "--gate-rounds", "1", "--live-s", "3", "--window-s", "1.5",
                    "--min-drafts", str(MIN_DRAFTS), "--out", str(out),
                ]
            )  # fmt: skip
        finally:
            stop.set()
            running.result()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory):
    """A healthy twin and the band recorded on it (gate prompts + live traffic)."""
    tmp = tmp_path_factory.mktemp("healthy")
    twin, base = start(tmp, "healthy")
    try:
        out = tmp / "dsv4-flash-dspark.acceptance.json"
        assert record_band(base, out) == 0, twin.log()[-2000:]
        yield twin, base, out
    finally:
        twin.stop()


def test_the_recorded_baseline_says_how_it_was_recorded(healthy) -> None:
    _, base, out = healthy
    doc = json.loads(out.read_text())
    rec = doc["recorded"]
    assert rec["simulator"] is True and rec["endpoint"] == base
    assert rec["method"]["gate_rounds"] == 1 and rec["method"]["live_s"] == 3
    assert [o["source"] for o in rec["observations"]][0] == "gate"
    assert any(o["used"] and o["source"] == "live" for o in rec["observations"])
    band = baseline.load(out)
    assert band is not None and band.positions == 5 and band.min_drafts == MIN_DRAFTS
    assert 0.5 < band.depth_ratio_floor < 0.9


def test_a_change_of_traffic_mix_alone_does_not_fire(healthy) -> None:
    _, base, out = healthy
    band = baseline.load(out)
    seen = {}
    for kind in ("prose", "code", "agent"):
        r = window(base, {kind: 8}, band)
        assert r.state == OK, (kind, r.detail)
        seen[kind] = r.mean_length
    # the mix really changed the speed: prose ~2.2, code ~4.6 tokens per step
    assert seen["prose"] < 2.6 < 3.2 < seen["agent"] < 4.0 < seen["code"]


def test_dropped_draft_weights_fire_while_the_output_stays_the_same(healthy, tmp_path) -> None:
    _, good, out = healthy
    band = baseline.load(out)
    twin, bad = start(tmp_path, "decayed", fault="draft-decay:0.45")
    try:
        prompt = KINDS["agent"].format(i=99)
        assert complete(bad, prompt, 120) == complete(good, prompt, 120)  # same text
        r = window(bad, {"agent": 8, "code": 2, "prose": 2}, band)
        assert r.state == DROP, r.detail
        assert r.collapsed == [1, 2, 3, 4]
        assert r.per_pos[0] > 0.6 and r.per_pos[4] < 0.05  # the first holds, the last is gone
        assert "later draft positions collapse" in r.detail
    finally:
        twin.stop()


def test_watch_logs_a_drop_and_a_bad_canary_as_events_and_never_restarts(healthy, tmp_path) -> None:
    _, _, out = healthy
    twin, base = start(tmp_path, "watched", fault="draft-decay:0.45;no-answers")
    try:
        lines_logged: list[str] = []
        clock = [0.0]
        ep = Endpoint.parse(base)
        rec_path = tmp_path / "monitor.json"
        mon = Monitors(
            MonitorConfig(canary_every_s=900, window_s=60, max_window_s=600),
            counters=lambda: counters_of(metrics(base)),
            band=lambda: baseline.load(out),
            canary=lambda: run_against(ep),
            log=lines_logged.append,
            record=rec_path,
            clock=lambda: clock[0],
        )
        restarts = []
        dog = watch.Watchdog(
            watch.WatchConfig(interval_s=30),
            probe=lambda: watch.probe_token(base, 10),
            restart=lambda: restarts.append(1) or 0,
            log=lines_logged.append,
            after_ok=mon.after_ok_probe,
        )
        dog.tick()  # the first snapshot, and the canary (no answers: every reply is wrong)
        traffic(base, {"agent": 8, "code": 2, "prose": 2})
        clock[0] = 90.0
        dog.tick()
        assert not restarts
        assert any(
            ln.startswith("CANARY EVENT (no restart): canary: 0/5 right") for ln in lines_logged
        )
        assert any(ln.startswith("ACCEPTANCE DROP (no restart)") for ln in lines_logged)
        rec = read_record(rec_path)
        assert rec is not None and rec["acceptance"]["state"] == DROP
        assert not rec["canary"]["passed"]
        events = events_of(None, rec)
        assert [e.split(" (")[0] for e in events] == ["acceptance drop", "canary"]
        shown = lines(None, rec, events)
        assert any(x.startswith("output canary (recorded by watch") for x in shown)
    finally:
        twin.stop()


def test_the_canary_passes_on_a_healthy_pair(healthy) -> None:
    _, base, _ = healthy
    res = run_against(Endpoint.parse(base))
    assert [v.kind for v in res.verdicts] == ["ok"] * 5, res.summary()
    assert res.summary() == "canary: 5/5 right"
