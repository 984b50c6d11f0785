"""The acceptance probe's measurement and judgement (pairctl/sentinel/probe.py,
judgement.py, probefile.py), pure: a pretend server's counters (tests/support/fake_spec.py)
moved as vLLM 0.33's are.

Healthy prompts of different shapes (an easy first token and hard later ones, uniformly
low, steep, flat, and the field's agent traffic 81.6/62.3/46.0/33.2/24.0%, MiaAI-Lab's
agent doc) are recorded, then read again healthy, under traffic of other shapes, and with
the field's broken-draft signatures as the simulator models them (sim/twin/draft_faults.py:
dropped draft weights 60% -> 26%, the grammar profile .914/.224/0/0/0, a position-0
collapse).
"""

from __future__ import annotations

import json
import random

import pytest

from pairctl.sentinel import probefile
from pairctl.sentinel.judgement import FAULT, OK, Margins, floors, judge, summarise
from pairctl.sentinel.probe import (
    BUSY,
    BY_DIFFERENCE,
    ERROR,
    FEW_DRAFTS,
    NO_SPEC,
    PER_REQUEST,
    Answer,
    Measurement,
    ProbePrompt,
    Skip,
    from_histogram,
    load_set,
    measure,
)
from pairctl.sentinel.probefile import ProbeKey
from pairctl.status.metrics import Scrape
from sim.twin.draft_faults import DraftFault
from tests.support.fake_spec import FakeServer, K, cum, hist, steps

SHAPES = {  # conditional acceptance per position (k given k-1)
    "easy_first_hard_later": [0.95, 0.45, 0.40, 0.35, 0.30],
    "uniformly_low": [0.40] * 5,
    "steep": [0.90, 0.70, 0.45, 0.25, 0.10],
    "flat": [0.80] * 5,
    "field_agent": [0.816, 0.623 / 0.816, 0.460 / 0.623, 0.332 / 0.460, 0.240 / 0.332],
}
FAULTS = {
    "weights_dropped": DraftFault("draft-weights-dropped"),
    "grammar": DraftFault("draft-grammar"),
    "first_collapse": DraftFault("draft-first-collapse", 0.05),
}
PROMPTS = {n: ProbePrompt(n, n, f"prompt {n}") for n in SHAPES}


def exact(name: str, marginals: list[float], drafts: int = 1000) -> Measurement:
    """A reading with exactly these shares (a deterministic greedy engine repeats it)."""
    return Measurement(name, drafts, tuple(round(drafts * m) for m in marginals), 0, "x", 0.0)


def test_the_histogram_gives_what_the_per_position_counters_count() -> None:
    js = [0, 0, 1, 3, 3, 3, 5, 5, 5, 5]
    server = FakeServer({})
    server.run(js)  # observe_draft: a step that accepted j counts positions 0..j-1
    assert from_histogram(hist(js)) == (server.drafts, tuple(server.per_pos))
    assert from_histogram([2, 1, 0, 3, 0, 4]) == (10, (8, 7, 7, 4, 4))


def test_the_probe_asks_greedy_in_chat_mode_and_reads_tokens_and_metrics() -> None:
    from pairctl.endpoint import Endpoint
    from pairctl.sentinel.probeclient import ProbeClient

    sent = []

    class Reply:
        status_code = 200
        text = ""

        def json(self):
            spec = {"acceptance_histogram": [1, 0, 2, 0, 0, 7]}
            return {"usage": {"completion_tokens": 42}, "metrics": {"speculative_decoding": spec}}

    class Session:
        def post(self, url, json, timeout):
            sent.append((url, json))
            return Reply()

    c = ProbeClient(Session(), Endpoint.parse("http://127.0.0.1:9/v1"), "m", load_set())
    got = c.ask(c.probes.prompts[0])
    assert got == Answer(42, {"acceptance_histogram": [1, 0, 2, 0, 0, 7]})
    url, body = sent[0]
    assert url == "http://127.0.0.1:9/v1/chat/completions"
    assert body["temperature"] == 0.0 and body["stream"] is False
    assert body["chat_template_kwargs"] == {"thinking": False}
    assert body["max_tokens"] == c.probes.max_tokens
    assert body["messages"] == [{"role": "user", "content": c.probes.prompts[0].prompt}]


def test_the_shipped_prompts_are_prose_code_and_agent_json() -> None:
    s = load_set()
    assert {p.kind for p in s.prompts} == {"prose", "code", "agent"}
    assert s.max_tokens >= 4 * s.min_drafts  # ~3.5 tokens a step leaves room for the minimum


# -- measurement --------------------------------------------------------------------------


def server_for(**kw) -> FakeServer:
    return FakeServer({n: cum(c) for n, c in SHAPES.items()}, **kw)


def read(server: FakeServer, name: str = "flat", per_request: bool = False):
    return measure(PROMPTS[name], server.scrape, server.ask, 16, per_request, sleep=lambda _s: None)


def test_on_an_idle_pair_the_difference_is_the_probes_own_drafts() -> None:
    server = server_for(seed=3)
    server.traffic(cum(SHAPES["uniformly_low"]), 500)  # earlier traffic: in both scrapes
    before = list(server.per_pos), server.drafts
    m = read(server, "steep")
    assert isinstance(m, Measurement) and m.method == BY_DIFFERENCE
    assert m.drafts == server.drafts - before[1] == server.drafts_per_probe
    assert list(m.accepted) == [a - b for a, b in zip(server.per_pos, before[0], strict=True)]
    assert m.tokens == server.gen - 500 - sum(before[0])  # its reply, counted by vLLM too


def test_traffic_during_a_reading_by_difference_makes_it_busy_not_judged() -> None:
    server = server_for(during=[(cum(SHAPES["uniformly_low"]), 40)])
    got = read(server)
    assert isinstance(got, Skip) and got.reason == BUSY
    assert "other requests generated" in got.detail


def test_a_busy_pair_is_not_asked_at_all() -> None:
    server = server_for(running=2)
    got = read(server)
    assert isinstance(got, Skip) and got.reason == BUSY and server.asked == 0
    assert "2 request(s) running" in got.detail


def test_per_request_metrics_read_under_traffic_are_the_requests_own() -> None:
    server = server_for(per_request=True, running=3, during=[(cum(SHAPES["flat"]), 80)])
    m = read(server, "uniformly_low", per_request=True)
    assert isinstance(m, Measurement) and m.method == PER_REQUEST
    assert m.drafts == server.drafts_per_probe  # the traffic's 80 steps are not in it
    # known not to send them: a busy pair is not asked; not known yet: asked once, and the
    # reply says (a reading from its metrics, or busy when it has none)
    assert read(server_for(per_request=True, running=3)).reason == BUSY
    unknown = server_for(per_request=True, running=3)
    assert read(unknown, per_request=None).method == PER_REQUEST
    without = server_for(running=3)
    got = read(without, per_request=None)
    assert got.reason == BUSY and "sends no per-request" in got.detail and without.asked == 1


def test_counters_that_lag_the_reply_are_waited_for() -> None:
    server = server_for(lag_scrapes=2)
    m = read(server)
    assert isinstance(m, Measurement) and m.drafts == server.drafts_per_probe


def test_counters_that_never_show_the_reply_are_an_error() -> None:
    server = server_for()
    s = server.scrape()
    got = measure(
        PROMPTS["flat"], lambda: s, lambda p: Answer(50, None), 16, clock=iter(range(100)).__next__,
        sleep=lambda _s: None, settle_s=3,
    )  # fmt: skip
    assert isinstance(got, Skip) and got.reason == ERROR and "counted 0 of" in got.detail


def test_no_drafting_few_drafts_and_a_restart_are_said() -> None:
    bare = Scrape({})
    got = measure(PROMPTS["flat"], lambda: bare, lambda p: Answer(5, None), 16)
    assert isinstance(got, Skip) and got.reason == NO_SPEC
    few = read(server_for(drafts_per_probe=5))
    assert isinstance(few, Skip) and few.reason == FEW_DRAFTS
    server = server_for()
    server.traffic(cum(SHAPES["flat"]), 100)
    first = server.scrape()
    fresh = server_for()  # the server restarted: its counters start again from 0
    seq = iter([first, fresh.scrape()])
    got = measure(PROMPTS["flat"], lambda: next(seq), fresh.ask, 16)
    assert isinstance(got, Skip) and got.reason == ERROR and "restarted" in got.detail


# -- judgement ----------------------------------------------------------------------------


def record_of(name: str, marginals: list[float], reads: list[Measurement] | None = None):
    return summarise(name, name, reads or [exact(name, marginals)] * 3)


def faulty(shape: list[float], fault: DraftFault) -> list[float]:
    return cum(fault.apply(list(shape)))


# Which signature each healthy shape shows, on a deterministic engine (readings repeat the
# record exactly). The grammar leaves positions 0-1 near their figures and zeroes 2+: a
# prompt whose position 2 was already near 0 (uniformly low: 6%) cannot show it, the others
# (17-51%) do. The round fires when any of its prompts does.
FIRES = {
    ("weights_dropped", "easy_first_hard_later"): True,
    ("weights_dropped", "uniformly_low"): True,
    ("weights_dropped", "steep"): True,
    ("weights_dropped", "flat"): True,
    ("weights_dropped", "field_agent"): True,
    ("grammar", "easy_first_hard_later"): True,
    ("grammar", "uniformly_low"): False,
    ("grammar", "steep"): True,
    ("grammar", "flat"): True,
    ("grammar", "field_agent"): True,
    ("first_collapse", "easy_first_hard_later"): True,
    ("first_collapse", "uniformly_low"): True,
    ("first_collapse", "steep"): True,
    ("first_collapse", "flat"): True,
    ("first_collapse", "field_agent"): True,
}


@pytest.mark.parametrize(("fault", "shape"), sorted(FIRES))
def test_each_field_signature_fires_where_the_prompt_can_show_it(fault: str, shape: str) -> None:
    rec = record_of(shape, cum(SHAPES[shape]))
    assert judge(exact(shape, cum(SHAPES[shape])), rec).state == OK
    v = judge(exact(shape, faulty(SHAPES[shape], FAULTS[fault])), rec)
    assert (v.state == FAULT) is FIRES[(fault, shape)], v.detail
    if fault == "first_collapse":
        assert 0 in v.below
    if fault == "grammar" and v.event:
        assert 0 not in v.below and v.below[0] in (1, 2)


def test_the_field_numbers_of_dropped_weights_fire() -> None:
    """The draft acceptance rate 60% -> 26% (tonyd2wild "Patch 4") on a prompt at 60%."""
    healthy = cum([0.833] * 5)
    broken = cum([0.58] * 5)
    rate = [sum(m) / 5 for m in (healthy, broken)]
    assert rate == pytest.approx([0.60, 0.26], abs=0.01)
    v = judge(exact("p", broken), record_of("p", healthy))
    assert v.state == FAULT and v.below == [0, 1, 2, 3, 4], v.detail
    assert "below the floor at position 0, 1, 2, 3, 4: 58/34/" in v.detail
    assert "against floors 62/" in v.detail


def test_floors_are_the_mean_less_the_spread_less_the_larger_margin() -> None:
    assert floors((0.8, 0.3, 0.05), (0.02, 0.0, 0.0), Margins(0.1, 0.25)) == (0.58, 0.2, 0.0)
    reads = [exact("p", [0.9, 0.5]), exact("p", [0.8, 0.5]), exact("p", [0.85, 0.5])]
    rec = summarise("p", "prose", reads)
    assert rec.per_pos == (0.85, 0.5) and rec.spread == pytest.approx((0.1, 0.0))
    assert rec.floor == pytest.approx((0.85 - 0.1 - 0.2125, 0.375))
    assert judge(exact("p", [0.53, 0.5]), rec).state == FAULT  # below 0.5375
    assert judge(exact("p", [0.53, 0.5]), rec).below == [0]
    assert judge(exact("p", [0.54, 0.38]), rec).state == OK


def test_a_server_drafting_fewer_positions_fires_and_more_is_noted() -> None:
    rec = record_of("p", cum(SHAPES["flat"]))
    fewer = Measurement("p", 100, (80, 64, 51), 0, "x", 0.0)  # num_speculative_tokens 5 -> 3
    v = judge(fewer, rec)
    assert v.state == FAULT and v.below == [3, 4] and "drafts 3 position(s)" in v.note
    more = exact("p", cum(SHAPES["flat"] + [0.8, 0.8]))
    v = judge(more, rec)
    assert v.state == OK and "record the probe again" in v.note


def test_repeats_that_disagree_on_positions_make_no_record() -> None:
    with pytest.raises(ValueError, match="different numbers of positions"):
        summarise("p", "prose", [exact("p", [0.5, 0.2]), exact("p", [0.5])])


# -- traffic cannot move it --------------------------------------------------------------


def test_healthy_traffic_of_any_shape_never_moves_a_judgement() -> None:
    """Prompts of every shape recorded on a pretend engine with real sampling noise (200
    drafts a reading), then read 40 times each while traffic of random shapes and mixes
    runs before, during and between readings. A reading taken during traffic is dropped
    (BUSY); every reading taken is judged OK. The control: the same contaminated window
    judged as if it were the probe's own (no guard) fires for uniformly low traffic."""
    rng = random.Random(7)
    server = server_for(seed=11, drafts_per_probe=200)
    recs = {}
    for n in SHAPES:
        reads = [read(server, n) for _ in range(3)]
        assert all(isinstance(r, Measurement) for r in reads)
        recs[n] = summarise(n, n, reads)
    judged, dropped = 0, 0
    for i in range(40 * len(SHAPES)):
        mix = rng.sample(sorted(SHAPES), rng.randint(1, 3))
        server.traffic(cum(SHAPES[rng.choice(mix)]), rng.randint(0, 300))
        server.during = [(cum(SHAPES[m]), rng.randint(1, 200)) for m in mix] if i % 3 else []
        name = sorted(SHAPES)[i % len(SHAPES)]
        got = read(server, name)
        if isinstance(got, Skip):
            assert got.reason == BUSY and server.during, got
            dropped += 1
            continue
        v = judge(got, recs[name])
        if v.state == FAULT:  # watch reads it again at once before it counts (schedule)
            server.during = []
            v = judge(read(server, name), recs[name])
        assert v.state == OK, v.detail
        judged += 1
    assert judged > 60 and dropped > 60
    # control: what the counters showed over a probe of the code-like prompt while
    # uniformly low traffic ran, judged as if it were the prompt's own
    server.during = [(cum(SHAPES["uniformly_low"]), 600)]
    d0, a0 = server.drafts, list(server.per_pos)
    server.ask(PROMPTS["flat"])
    mixed = Measurement(
        "flat",
        round(server.drafts - d0),
        tuple(round(x - y) for x, y in zip(server.per_pos, a0, strict=True)),
        0,
        "unguarded",
        0.0,
    )
    assert judge(mixed, recs["flat"]).state == FAULT


def test_the_noisy_signatures_still_fire() -> None:
    """With sampling noise in the record and the reading (200 drafts), every signature
    that moves a position by 0.2 or more fires."""
    server = server_for(seed=5, drafts_per_probe=200)
    for n in ("flat", "steep", "field_agent"):
        rec = summarise(n, n, [read(server, n) for _ in range(3)])
        for f in FAULTS.values():
            broken = FakeServer({n: faulty(SHAPES[n], f)}, drafts_per_probe=200, seed=9)
            v = judge(read(broken, n), rec)
            assert v.state == FAULT, (n, f.kind, v.detail)


# -- the record file ----------------------------------------------------------------------


def test_a_record_file_round_trips_and_is_an_alert_floors_classes_file(tmp_path) -> None:
    key = ProbeKey("dsv4-flash-dspark", "fork", "9e165c30" + "0" * 32)
    assert key.file_name() == "dsv4-flash-dspark.fork.9e165c300000.probe.json"
    assert ProbeKey("r", "cpu", "").file_name() == "r.cpu.unpinned.probe.json"
    recs = [record_of(n, cum(c)) for n, c in SHAPES.items()]
    doc = probefile.document(key, recs, {"absolute": 0.1, "relative": 0.25}, {"at": "t"})
    path = probefile.path_in(tmp_path, key)
    probefile.save(path, doc)
    back = probefile.load(path)
    assert back is not None and back.key == key and set(back.prompts) == set(SHAPES)
    assert back.prompts["steep"].floor == recs[2].floor
    raw = json.loads(path.read_text())
    assert raw["source"].startswith("acceptance probe recorded t")
    # `fleet alert-floors --classes FILE` takes the record as it is: the alert floors come
    # from the probe's healthy classes
    from pairctl.fleet.alertfloors import floors as alert_floors
    from pairctl.fleet.alertfloors import load_classes

    classes, source = load_classes(path)
    assert [c.name for c in classes] == list(SHAPES) and source == raw["source"]
    assert classes[2].per_pos == recs[2].per_pos
    assert alert_floors(classes).first_position == pytest.approx(0.5 * 0.4, abs=0.001)


def test_a_broken_record_file_says_record_it_again(tmp_path) -> None:
    assert probefile.load(tmp_path / "none.json") is None
    p = tmp_path / "r.json"
    p.write_text("{")
    with pytest.raises(probefile.ProbeFileError, match="record it again"):
        probefile.load(p)
    p.write_text(json.dumps({"key": {"recipe": "r", "stack": "s", "revision": ""}, "classes": [
        {"name": "a", "per_pos": [0.5, 0.2], "spread": [0.0], "floor": [0.4, 0.1]}]}))  # fmt: skip
    with pytest.raises(probefile.ProbeFileError, match="one entry per position"):
        probefile.load(p)


def test_steps_follow_the_marginals() -> None:
    js = steps(cum(SHAPES["steep"]), 20000, random.Random(1))
    drafts, a = from_histogram(hist(js))
    assert [x / drafts for x in a] == pytest.approx(cum(SHAPES["steep"]), abs=0.01)
    assert len(a) == K


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "name the pair with --env-file FILE, or an endpoint with --url URL"),
        (["--url", "http://127.0.0.1:9"], "with --url, say where the record goes: --out FILE"),
        (["--env-file", "x.env", "--stack", "cpu"], "--stack and --revision go with --url"),
        (["--url", "h:1", "--out", "/tmp/r.json", "--relative-margin", "1"], "below 1"),
        (["--url", "h:1", "--out", "/tmp/r.json", "--repeats", "1"], "--repeats"),
    ],
)
def test_record_refuses_a_command_line_it_cannot_keep(argv, says, capsys) -> None:
    from pairctl.sentinel import record

    with pytest.raises(SystemExit) as exc:
        record.parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_record_for_an_env_file_goes_beside_it_by_default(tmp_path) -> None:
    """`sentinel record --env-file F` without --out: the record is the one `up --gate` and
    `watch` read, probes/<key>.probe.json beside F."""
    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.resolved import load
    from pairctl.sentinel import pair as sentinel_pair
    from pairctl.sentinel import record
    from tests.support.fleet import env_file

    env = env_file(tmp_path, "pair-a", "127.0.0.1", "127.0.0.2")
    ep, key, out, plan_hash = record.target(record.parse_args(["--env-file", str(env)]))
    pair = load(str(env), str(DEFAULT_RECIPE))
    assert out == sentinel_pair.probe_record_path(pair)
    assert out.parent == tmp_path / "probes" and key == sentinel_pair.key_of(pair)
    assert ep.base == pair.endpoint and plan_hash == pair.plan_hash
