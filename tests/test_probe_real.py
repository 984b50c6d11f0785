"""The acceptance probe on the real CPU engine (vLLM's CPU build, tests/support/real_engine.py),
with a judge that can fail: two boots.

1. A healthy server with the CPU stack's ngram drafts (5 tokens, prompt_lookup_max 4) and no
   per-request metrics: the probe reads its drafts by difference of /metrics. The record of
   the shipped prompts (64-token replies here) is made with ``sentinel record``; traffic of
   other shapes (a counting loop, prose) runs between probe rounds and during them, and
   shows its own acceptance on /metrics; every reading taken during traffic is dropped,
   every round reads ok.
2. The same tiny model served with a draft whose weights were not loaded (its embedding at
   zero, sim/engine/broken_draft.py), answering with per-request spec-decode metrics: the
   output text is the healthy server's token for token, and the probe fires (position 0).

Measured on this engine (not asserted): ngram drafts on the tiny model's looping output are
accepted ~90-100% at every position whatever prompt_lookup_min/max say (a loop matches any
n-gram), so an ngram setting does not make drafts miss here; num_speculative_tokens 2 drafts
two positions at 99%/96% (the probe counts the missing three as 0: a fault,
tests/test_probe.py).
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from pairctl.endpoint import Endpoint, wait_ready
from pairctl.sentinel import probefile, record
from pairctl.sentinel.monitors import MonitorConfig, Monitors
from pairctl.sentinel.probe import BY_DIFFERENCE, PER_REQUEST, PROBE_PROMPTS, load_set
from pairctl.sentinel.probeclient import ProbeClient
from pairctl.sentinel.schedule import ProbeSchedule
from pairctl.status.metrics import figures, parse
from tests.support.real_engine import ENGINE_PY, RealServer, tiny_model
from tests.support.twin import REPO, free_port

pytestmark = [pytest.mark.needs_engine]

LOOP = [f"{i} " + "one two three four " * 30 for i in range(3)]
# The shipped prompts with 64 tokens a reply instead of 256: a broken draft on this engine
# decodes one token a verify step, and each step runs the draft model five times.
SHORT = {"max_tokens": 64, "min_drafts": 8}


def short_prompts(tmp: Path) -> Path:
    doc = {**json.loads(PROBE_PROMPTS.read_text()), **SHORT}
    path = tmp / "probe_prompts_short.json"
    path.write_text(json.dumps(doc))
    return path


PROSE = [f"Tell me, in plain words, about harbour number {i} at dawn." for i in range(3)]


def client(base: str, prompts: Path) -> ProbeClient:
    ep = Endpoint.parse(base)
    s = ep.session(trust_env=False)
    return ProbeClient(s, ep, wait_ready(s, ep, 30, lambda _m: None).model, load_set(prompts))


def complete(base: str, prompt: str, tokens: int = 64) -> None:
    body = {"model": model_of(base), "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    r = requests.post(base + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text


def model_of(base: str) -> str:
    return requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]


def reply(base: str) -> str:
    """The code probe prompt's reply text (greedy, chat mode): what a user would read."""
    p = load_set().prompts[1]
    body = {
        "model": model_of(base),
        "messages": [{"role": "user", "content": p.prompt}],
        "temperature": 0,
        "max_tokens": 64,
        "chat_template_kwargs": {"thinking": False},
    }
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def rig(base: str, rec: Path, clock: list[float], seen: list):
    c = client(base, rec.with_name("probe_prompts_short.json"))

    def measure(p):
        got = c.measure(p)
        seen.append(got)
        return got

    schedule = ProbeSchedule(
        900, list(c.probes.prompts), measure, lambda: probefile.load(rec), lambda: clock[0]
    )
    lines: list[str] = []
    mon = Monitors(
        MonitorConfig(canary_every_s=0, probe_every_s=900),
        probe=schedule, canary=None, log=lines.append, clock=lambda: clock[0],
    )  # fmt: skip
    return mon, schedule, lines


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("probe-real")
    srv = RealServer(free_port(), tmp / "healthy.log")
    try:
        srv.wait_ready()
        rec = tmp / "dsv4-flash-dspark.cpu.unpinned.probe.json"
        argv = ["--url", srv.base, "--stack", "cpu", "--out", str(rec), "--busy-wait", "60"]
        argv += ["--prompts", str(short_prompts(tmp))]
        assert record.main(argv) == 0, srv.log()[-3000:]
        yield srv, rec, tmp
    finally:
        srv.stop()


def test_the_record_on_the_real_engine_is_by_difference_and_repeats_exactly(healthy) -> None:
    _, rec, _ = healthy
    doc = json.loads(rec.read_text())
    assert doc["recorded"]["simulator"] is False and doc["key"]["stack"] == "cpu"
    assert doc["recorded"]["per_request_metrics"] is False
    for c in doc["classes"]:
        assert c["method"] == BY_DIFFERENCE and len(c["per_pos"]) == 5, c
        assert max(c["spread"]) == 0.0, c  # greedy on one server: the same drafts each time
        assert min(c["drafts"]) >= 8 and c["per_pos"][0] > 0.5, c
    assert doc["recorded"]["max_tokens"] == 64
    print("\nprobe record on the CPU engine:", [(c["name"], c["per_pos"]) for c in doc["classes"]])


def test_traffic_of_other_shapes_between_and_during_rounds_never_moves_it(healthy) -> None:
    srv, rec, _ = healthy
    shown = {}
    for name, prompts in (("loop", LOOP), ("prose", PROSE)):
        before = parse(requests.get(srv.base + "/metrics", timeout=10).text)
        for p in prompts:
            complete(srv.base, p)
        after = parse(requests.get(srv.base + "/metrics", timeout=10).text)
        shown[name] = figures(after, before, 1.0).acceptance_per_pos
    print(f"\nlive acceptance per position: {shown}")
    clock, seen = [0.0], []
    mon, schedule, lines = rig(srv.base, rec, clock, seen)
    mon.after_ok_probe()  # a round on the idle pair
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for p in (*LOOP, *PROSE):
                complete(srv.base, p, 96)

    bg = threading.Thread(target=load, daemon=True)
    clock[0] = 900.0
    bg.start()
    try:
        for k in range(4):  # the next round, with traffic running
            clock[0] = 900.0 + 30 * k
            mon.after_ok_probe()
    finally:
        stop.set()
        bg.join()
    for p in LOOP:
        complete(srv.base, p)  # between
    clock[0] = 1200.0
    mon.after_ok_probe()  # idle again: the round finishes
    assert schedule.started is None
    assert lines == [lines[0]] and lines[0].startswith("acceptance probe ok"), lines
    busy = [r for r in seen if getattr(r, "reason", None) == "busy"]
    judged = [r for r in seen if getattr(r, "method", None) == BY_DIFFERENCE]
    assert busy and len(judged) >= 6, seen  # readings during traffic were dropped


def test_a_draft_whose_weights_were_not_loaded_fires_with_the_output_unchanged(healthy) -> None:
    srv, rec, tmp = healthy
    want = reply(srv.base)
    srv.stop()  # one engine at a time on the test machine
    draft = tmp / "draft-not-loaded"
    subprocess.run(
        [str(ENGINE_PY), "-m", "sim.engine.broken_draft", str(tiny_model()), str(draft)],
        check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 5})
    bad = RealServer(
        free_port(), tmp / "broken.log", spec, ("--per-request-spec-decode-metrics", "summary")
    )
    try:
        bad.wait_ready()
        assert reply(bad.base) == want  # the silent fault: the same text
        clock, seen = [0.0], []
        mon, _, lines = rig(bad.base, rec, clock, seen)
        mon.after_ok_probe()
        print(f"\nbroken draft: {lines}")
        assert len(lines) == 1 and lines[0].startswith("ACCEPTANCE PROBE FAULT (no restart)")
        assert "prose: below the floor at position 0, 1, 2, 3, 4: 0/0/0/0/0%" in lines[0]
        assert len(seen) == 6  # each prompt read twice: the FAULT confirmed
        assert seen and all(getattr(r, "method", None) == PER_REQUEST for r in seen), seen
    finally:
        bad.stop()
