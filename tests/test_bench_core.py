"""bench/ core against a stdlib mock server with known timings (no simulator needed).

Ground truth here is the mock's configuration: TTFT, step period and tokens per step, the
gauges it exports, and which requests were foreign.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import requests

from bench.benchlib import EXIT_CONTAMINATED, EXIT_ERROR, EXIT_OK, conserve, promm
from bench.benchlib.guard import (
    Attempt,
    GuardConfig,
    GuardedPoint,
    GuardError,
    InFlightTracker,
    run_guarded,
)
from bench.benchlib.response import StreamResult
from bench.benchlib.results import Results, Tally, clean_metrics, summarize_points
from bench.benchlib.stats import percentile, request_metrics, summarize, window_rate
from bench.benchlib.stream import stream_request
from pairctl.endpoint import Endpoint
from tests.fakes.mock_openai import MockConfig, MockServer
from tests.support.bench_twin import HEADROOM, LOADED_LAG_MS, server_ttft_ms

CHAT = "/v1/chat/completions"


def payload(max_tokens: int = 31, text: str = "hello there") -> dict:
    return {
        "model": "mock-model",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
    }


# ---- the request function and the metric maths ------------------------------------------
def test_stream_timings_match_mock_speeds():
    """The client's figures hold the mock's own record of the same request (same process,
    same clock): by order, and within 3x the loaded box's lag, never a load-sized window."""
    cfg = MockConfig(ttft_s=0.06, step_s=0.02, tokens_per_step=(3, 2))
    with MockServer(cfg) as m:
        r = stream_request(m.endpoint, CHAT, payload(max_tokens=61))
        # the mock adds its finish fields just after its last write: wait for them
        deadline = time.monotonic() + 10
        while "finish_ns" not in m.records()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        (rec,) = m.records()
    assert r.ok, r.error
    m_ = request_metrics(r)
    slack = HEADROOM * LOADED_LAG_MS
    # The role-only chunk arrives before the mock even sleeps: TTFT must not be taken from
    # it. The mock sleeps 60 ms from arrival before its first token.
    server_ttft = server_ttft_ms(rec)
    assert server_ttft >= 60
    assert m_["first_chunk_ms"] < m_["ttft_ms"]
    assert server_ttft - 0.1 < m_["ttft_ms"] <= server_ttft + slack
    assert r.completion_tokens == 61 and r.prompt_tokens is not None
    assert r.request_id and r.request_id.startswith("mock-")
    # 1 + 2.5 tokens per 20 ms step: 60 tokens after the first in 24 steps. The mock's
    # deadlines are absolute from arrival (60 ms, then 24 x 20 ms), so by its clock the stream
    # ends >= 540 ms after arrival; its first token may be late under load (a run saw the
    # decode span at 478.7 ms), so the span from it is not held to 480. The client saw the
    # same span as the mock.
    server_decode_ms = (rec["finish_ns"] - rec["first_token_ns"]) / 1e6
    assert (rec["finish_ns"] - rec["received_ns"]) / 1e6 >= 60 + 480
    client_decode_ms = 60 / m_["decode_tok_s"] * 1000
    assert abs(client_decode_ms - server_decode_ms) <= slack, (client_decode_ms, server_decode_ms)
    assert m_["tpot_ms"] == pytest.approx(client_decode_ms / 60, rel=1e-6)
    # ITL is per event (20 ms steps), not per token (8 ms): a median between them says which.
    assert 14 <= m_["itl_ms"]["median"] <= 30
    assert m_["token_events"] == 25


def test_errors_are_kept_with_text_and_metrics_are_null():
    with MockServer(MockConfig(mode="http500")) as m:
        r = stream_request(m.endpoint, CHAT, payload())
    assert not r.ok and r.status == 500 and "boom" in r.error
    m_ = request_metrics(r)
    assert m_["ttft_ms"] is None and m_["decode_tok_s"] is None and m_["tpot_ms"] is None
    dead = stream_request(Endpoint.parse("http://127.0.0.1:9"), CHAT, payload(), timeout_s=2)
    assert not dead.ok and "Connection" in dead.error or "refused" in dead.error.lower()


def _synthetic(first: int, gaps: list[int], tokens: int | None, t_req: int = 0) -> StreamResult:
    ts = [first]
    for g in gaps:
        ts.append(ts[-1] + g)
    return StreamResult(
        ok=True,
        t_request_ns=t_req,
        t_first_token_ns=ts[0],
        t_last_token_ns=ts[-1],
        token_chunk_ns=ts,
        completion_tokens=tokens,
    )


def test_formulas_on_synthetic_timings():
    ms = 1_000_000
    r = _synthetic(100 * ms, [10 * ms] * 9, tokens=28)  # 10 events, 27 tokens after the first
    m = request_metrics(r)
    assert m["ttft_ms"] == pytest.approx(100)
    assert m["latency_ms"] == pytest.approx(190)
    assert m["tpot_ms"] == pytest.approx(90 / 27)
    assert m["decode_tok_s"] == pytest.approx(27 / 0.090)
    assert m["itl_ms"]["median"] == pytest.approx(10) and m["itl_max_ms"] == pytest.approx(10)
    # Missing usage, or a single token: TPOT and decode rate are null, never 0.
    assert request_metrics(_synthetic(5 * ms, [ms], tokens=None))["tpot_ms"] is None
    assert request_metrics(_synthetic(5 * ms, [], tokens=1))["decode_tok_s"] is None
    assert summarize([])["median"] is None and summarize([None, None])["n"] == 0


def test_conc_steady_window_too_short_gives_null_not_a_wild_rate():
    from bench.bench_conc import steady_window

    ms = 1_000_000
    early = _synthetic(0, [10 * ms] * 20, tokens=41)  # events 0..200 ms
    late = _synthetic(185 * ms, [10 * ms] * 20, tokens=41)  # starts as `early` ends
    late.token_chunk_ns[1] = late.token_chunk_ns[0] + ms // 2  # one chunk delivered late
    w = steady_window([early, late])  # window 185..200 ms: 2 events of each stream
    assert w["active"] == 2 and w["per_req_decode_tok_s"] is None
    long = steady_window([early, _synthetic(5 * ms, [10 * ms] * 20, tokens=41)])
    assert long["per_req_decode_tok_s"] == pytest.approx(200.0)


def test_conc_steady_window_of_a_stream_read_in_one_go_is_null_not_a_crash():
    """A loaded CI box read one mock stream's whole answer in one go (first token = last) while
    the other's first token came later still: no stream decodes inside [start, end)."""
    from bench.bench_conc import steady_window

    ms = 1_000_000
    at_once = _synthetic(50 * ms, [], tokens=8)  # one event carries all 8 tokens
    later = _synthetic(50 * ms, [10 * ms] * 4, tokens=8)
    w = steady_window([at_once, later])
    assert w["active"] == 0 and w["window_ms"] is None
    assert w["per_req_decode_tok_s"] is None and w["aggregate_tok_s"] is None


def test_window_rate_counts_between_events():
    ms = 1_000_000
    r = _synthetic(0, [10 * ms] * 20, tokens=61)  # 3 tokens per event after the first
    rate, toks = window_rate(r, 35 * ms, 125 * ms)  # events at 40..120 ms
    assert toks == pytest.approx(8 * 3) and rate == pytest.approx(300.0)
    assert window_rate(r, 41 * ms, 49 * ms)[0] is None  # < 2 events: no rate
    assert window_rate(r, 35 * ms, 65 * ms)[0] is not None  # 3 events
    assert window_rate(r, 35 * ms, 65 * ms, min_events=4)[0] is None  # too few to trust
    assert percentile([1, 2, 3, 4], 50) == 2.5


# ---- /metrics ------------------------------------------------------------------------------
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 250.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 80.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 3.0
"""


def test_metrics_parse_and_delta():
    a = promm.parse(METRICS)
    assert a.running == 3.0 and a.waiting == 4.0 and a.in_flight == 7.0
    assert a.counters["vllm:spec_decode_num_drafts_total"] == 100.0
    assert a.per_pos == {0: 90.0, 1: 80.0}
    b = promm.parse(
        METRICS.replace("} 100.0", "} 140.0")
        .replace("} 250.0", "} 330.0")
        .replace("} 500.0", "} 700.0")
        .replace('position="0"} 90.0', 'position="0"} 126.0')
        .replace('position="1"} 80.0', 'position="1"} 110.0')
    )
    d = promm.delta(a, b)
    assert d["spec_drafts"] == 40 and d["spec_accepted_tokens"] == 80
    assert d["mean_accept_len"] == pytest.approx(1 + 80 / 40)
    assert d["accept_rate_pos"] == pytest.approx([36 / 40, 30 / 40])
    assert d["draft_accept_rate"] == pytest.approx(80 / 200)
    assert d["prompt_tokens"] is None  # not exported: null, not 0
    assert promm.parse("").in_flight is None


# ---- the guard -----------------------------------------------------------------------------
def test_tracker_peak_covers_the_scrape_window():
    tr = InFlightTracker(grace_s=0.05)
    tr.begin_window()
    tr.start()
    tr.finish()  # finished inside the window: still counted in the peak
    assert tr.end_window() == 1
    time.sleep(0.08)
    tr.begin_window()
    assert tr.end_window() == 0 and tr.count() == 0


def _wave_of(url: Endpoint, n: int, max_tokens: int = 12):
    def wave(tr: InFlightTracker):
        out = [None] * n

        def one(i: int) -> None:
            out[i] = stream_request(url, CHAT, payload(max_tokens, f"q{i}"), tracker=tr)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    return wave


FAST_GUARD = GuardConfig(retries=2, interval_s=0.02, grace_s=0.3, backoff_s=0.05)


def test_clean_waves_are_never_flagged_despite_gauge_lag():
    # The server notices requests late and forgets them late (within the grace).
    cfg = MockConfig(ttft_s=0.03, step_s=0.01, count_lag_s=0.15, start_lag_s=0.01)
    with MockServer(cfg) as m:
        for n in (1, 4, 8, 8, 1, 4):
            gp = run_guarded(m.endpoint, _wave_of(m.endpoint, n), FAST_GUARD)
            assert gp.status == "ok" and gp.retries == 0, gp.attempts[-1].reason
            during = [s for s in gp.attempts[0].samples if s["phase"] == "during"]
            assert during and max(s["ours"] for s in during) <= n
            assert any(s["running"] > 0 for s in during)  # the sampler did see our requests


@pytest.mark.parametrize("at_s", [0.0, 0.08, 0.16])
def test_foreign_traffic_during_a_wave_is_detected_and_retried(at_s):
    with MockServer(MockConfig(ttft_s=0.02, step_s=0.01)) as m:
        calls = []

        def wave(tr: InFlightTracker):
            calls.append(1)
            if len(calls) == 1:  # only the first attempt is polluted
                threading.Timer(at_s, m.inject_foreign, args=(1, 0.15)).start()
            # ~0.42 s: the foreign request (150 ms) fits inside the wave even when its timer
            # fires 100 ms late (with ~0.24 s, at 0.16 s it had 80 ms to meet a sample)
            return _wave_of(m.endpoint, 2, max_tokens=120)(tr)

        gp = run_guarded(m.endpoint, wave, FAST_GUARD)
    assert gp.status == "ok" and gp.retries == 1
    assert not gp.attempts[0].clean and "server had" in gp.attempts[0].reason
    assert gp.attempts[1].clean and gp.deltas is not None


def test_persistent_foreign_traffic_refuses():
    with MockServer(MockConfig(ttft_s=0.02, step_s=0.01)) as m:
        m.inject_foreign(2, 30)
        gp = run_guarded(m.endpoint, _wave_of(m.endpoint, 1), FAST_GUARD)
    assert gp.status == "contaminated" and gp.result is None and gp.deltas is None
    assert len(gp.attempts) == 3 and not any(a.clean for a in gp.attempts)
    assert "before" in gp.attempts[0].reason  # noticed before even sending


def test_guard_needs_the_gauges():
    with MockServer(MockConfig(mode="nogauges")) as m, pytest.raises(GuardError):
        run_guarded(m.endpoint, _wave_of(m.endpoint, 1), FAST_GUARD)


def test_deltas_give_acceptance_of_the_clean_wave():
    # 4 tokens per step = 3 accepted of 5 drafts at positions 0..2.
    with MockServer(MockConfig(ttft_s=0.02, step_s=0.005, tokens_per_step=(4,))) as m:
        gp = run_guarded(m.endpoint, _wave_of(m.endpoint, 2, max_tokens=41), FAST_GUARD)
        live = promm.scrape(requests.Session(), m.endpoint)
    assert gp.deltas["mean_accept_len"] == pytest.approx(4.0)
    assert gp.deltas["accept_rate_pos"] == pytest.approx([1, 1, 1, 0, 0])
    assert gp.deltas["generation_tokens"] == live.counters["vllm:generation_tokens_total"]


def test_exit_code_constant_is_distinct():
    assert EXIT_CONTAMINATED not in (0, 1, 2)


@pytest.mark.parametrize("abort", [True, False])
def test_contaminated_wave_is_cut_short_unless_told_not_to(abort):
    cfg = dataclasses.replace(FAST_GUARD, abort_early=abort)
    with MockServer(MockConfig(ttft_s=0.02, step_s=0.01)) as m:
        calls = []

        def wave(tr: InFlightTracker):
            calls.append(1)
            if len(calls) == 1:
                threading.Timer(0.1, m.inject_foreign, args=(1, 0.2)).start()
            return _wave_of(m.endpoint, 1, max_tokens=240)(tr)  # ~0.8 s when left alone

        gp = run_guarded(m.endpoint, wave, cfg)
    assert gp.status == "ok" and gp.retries == 1 and gp.result[0].ok
    first, clean = gp.attempts
    assert not first.clean
    if abort:
        assert first.duration_s < clean.duration_s - 0.4  # stopped ~0.1 s in, not at 0.8 s
    else:
        assert first.duration_s > clean.duration_s - 0.2


# ---- summary rows and exit accounting (benchlib.results) ------------------------------------
def _gp(status: str, retries: int = 0, reason: str | None = None) -> GuardedPoint:
    attempts = [Attempt(False, "foreign", [], 0.1)] * retries
    attempts.append(Attempt(status == "ok", reason, [], 0.1))
    return GuardedPoint(status, object() if status == "ok" else None, None, attempts, reason)


def test_points_add_up_to_the_exit_code_and_the_rows():
    res = Results()
    ok = res.add("a run0", _gp("ok", retries=1), {"error": None, "x_ms": 10.0}, run=0)
    assert ok["status"] == "ok" and ok["retries"] == 1 and ok["metrics"]["x_ms"] == 10.0
    assert res.exit_code == EXIT_OK
    bad = res.add("a run1", _gp("contaminated", 2, "all 3 attempts contaminated"), None, run=1)
    assert bad["metrics"] is None and bad["server_deltas"] is None and bad["retries"] == 2
    assert res.exit_code == EXIT_CONTAMINATED and res.exit_reasons[-1].startswith("a run1:")
    # A failed request on a clean wave is an error, not a number, and exit 1 wins over 3.
    err = res.add("b run0", _gp("ok"), {"error": "HTTP 500: boom", "x_ms": 1.0}, run=0)
    assert err["status"] == "error" and err["metrics"] is None and err["reason"] == "HTTP 500: boom"
    assert res.exit_code == EXIT_ERROR
    res.add("c run0", _gp("contaminated", 0, "before: busy"), None)
    assert res.exit_code == EXIT_ERROR and len(res.exit_reasons) == 3

    row = summarize_points(res.points[:2], ["x_ms", "missing_ms"])
    assert row.tally == Tally(runs_ok=1, retries=3, status="contaminated")
    assert row.median("x_ms") == 10.0 and row.stats["missing_ms"]["n"] == 0
    doc = row.to_json()
    assert list(doc)[-3:] == ["runs_ok", "retries", "status"]
    assert "runs_ok" not in row.to_json(runs_ok=False)
    assert Tally.of(res.points[:1]).status == "ok"
    assert clean_metrics(res.points) == [{"error": None, "x_ms": 10.0}]


# ---- token conservation (the guard's second line of defence) --------------------------------
def _ours(n: int = 2, prompt: int = 100, completion: int = 40, spec: bool = True) -> list:
    """n finished requests of ours, each 4 verify steps (3, 2, 5 and 0 accepted of 5 drafts)."""
    hist = [1, 0, 1, 1, 0, 1]
    out = []
    for _ in range(n):
        r = StreamResult(ok=True, prompt_tokens=prompt, completion_tokens=completion)
        r.finish_reason = "length"
        if spec:
            r.spec_decode = {
                "acceptance_histogram": hist,
                "num_spec_steps": 4,
                "num_draft_tokens": 20,
            }
        out.append(r)
    return out


def _deltas(**over) -> dict:
    d = {
        "requests_finished": 2.0,
        "prompt_tokens": 200.0,
        "generation_tokens": 80.0,
        "prefix_cache_queries": 200.0,
        "spec_drafts": 8.0,
        "spec_draft_tokens": 40.0,
        "spec_accepted_tokens": 20.0,
        "accepted_per_pos": [6.0, 6.0, 4.0, 2.0, 2.0],
    }
    return d | over


def test_conservation_accepts_exactly_our_own_requests():
    v = conserve.check(_deltas(), conserve.account(_ours()), gamma=5)
    assert v.clean and v.acceptance == conserve.CONSERVED and not v.unchecked
    assert {c.verdict for c in v.checks} == {"equal"}


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("requests_finished", 3.0, "requests finished"),  # a 1-token foreign request
        ("prompt_tokens", 264.0, "prompt tokens"),
        ("generation_tokens", 81.0, "generation tokens"),
        ("prefix_cache_queries", 264.0, "prefix-cache lookups"),  # aborted before its 1st token
        ("spec_drafts", 9.0, "verify steps"),
        ("spec_accepted_tokens", 23.0, "accepted drafts"),
        ("accepted_per_pos", [7.0, 6.0, 4.0, 2.0, 2.0], "accepted at position 0"),
    ],
)
def test_any_excess_over_our_account_is_contamination(field, value, name):
    v = conserve.check(_deltas(**{field: value}), conserve.account(_ours()), gamma=5)
    assert not v.clean and v.reason.startswith("conservation: ") and name in v.reason


def test_what_conservation_cannot_check_is_said_not_assumed():
    ours = conserve.account(_ours())
    off = conserve.check(_deltas(prefix_cache_queries=0.0), ours, gamma=5)
    assert off.clean and "prefix-cache lookups (no lookups counted: prefix caching is off)" in (
        off.unchecked
    )
    gone = conserve.check(_deltas(requests_finished=None), ours, gamma=5)
    assert gone.clean and "requests finished (not exported)" in gone.unchecked
    short = conserve.check(_deltas(prompt_tokens=150.0), ours, gamma=5)
    assert short.clean and short.unchecked[0].startswith("prompt tokens (server counted less")
    cut = conserve.account([*_ours(), StreamResult(error="timeout")])
    assert conserve.check(_deltas(), cut, gamma=5).acceptance == "unchecked: no usage"


def test_without_per_request_metrics_acceptance_is_only_bounded():
    ours = conserve.account(_ours(spec=False))
    # drafts + accepted (28) <= generation (80) - first tokens (2) + gamma x requests (10)
    ok = conserve.check(_deltas(), ours, gamma=5)
    assert ok.clean and ok.acceptance == conserve.BOUNDED
    assert "BOUNDED only" in conserve.describe([ok.acceptance])
    over = conserve.check(_deltas(spec_drafts=40.0, spec_accepted_tokens=60.0), ours, gamma=5)
    assert not over.clean and "verify steps + accepted drafts" in over.reason


def test_a_foreign_request_between_two_samples_is_caught_by_conservation():
    """Invisible to every sample (it never shows in the gauges), visible in every counter."""
    cfg = dataclasses.replace(FAST_GUARD, retries=1)
    with MockServer(MockConfig(ttft_s=0.02, step_s=0.01, spec_metrics=True)) as m:
        calls = []

        def wave(tr: InFlightTracker):
            calls.append(1)
            if len(calls) == 1:
                m.count_foreign(1, prompt_tokens=64, tokens=1)
            return _wave_of(m.endpoint, 1, max_tokens=12)(tr)

        gp = run_guarded(m.endpoint, wave, cfg)
    first, second = gp.attempts
    assert not first.clean and first.reason.startswith("conservation:")
    assert all(s["running"] <= s["ours"] for s in first.samples)  # sampling saw nothing
    assert gp.status == "ok" and second.clean and second.conservation.acceptance == "conserved"
    assert (
        gp.deltas["requests_finished"] == 1
        and gp.deltas["prompt_tokens"] == gp.result[0].prompt_tokens
    )
