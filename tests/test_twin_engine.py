"""The twin's engine on a virtual clock: batching, LPT threshold, spec-decode accounting.

The engine loop is the one the server runs; only its clock and sleep are virtual, so these
tests cover minutes of simulated serving in well under a second.
"""

from __future__ import annotations

import pytest

from sim.twin import profile as profmod
from sim.twin.engine import FOREVER, Engine, EngineConfig, Request
from sim.twin.metrics import Metrics
from sim.twin.prefix_cache import PrefixCache, block_hashes
from sim.twin.sampling import AcceptanceDrawer, key_of

PROF = profmod.load("rehearsal")
GAMMA = 5


class VClock:
    """A clock that only moves when the engine sleeps."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, secs: float) -> bool:
        self.t += max(secs, 0.0)
        return False


def make_engine(**over) -> tuple[Engine, VClock, list[str]]:
    cfg = dict(
        gamma=GAMMA,
        max_num_seqs=24,
        max_num_batched_tokens=8192,
        lpt_threshold=0,
        max_model_len=1 << 20,
        fp8_head=False,
        kv_capacity_tokens=1_200_000,
        step_timeout_s=None,
    )
    cfg.update(over)
    clock = VClock()
    deaths: list[str] = []
    eng = Engine(
        PROF,
        EngineConfig(**cfg),
        Metrics("m", GAMMA),
        PrefixCache(256, 10_000),
        on_death=deaths.append,
        clock=clock,
        sleep=clock.sleep,
    )
    return eng, clock, deaths


def make_req(
    eng: Engine, clock: VClock, prompt: list[int] | int, target: int = FOREVER, seed: int = 0
) -> Request:
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    key = key_of("t", seed, len(ids))
    return Request(
        id=eng.next_id(),
        prompt_len=len(ids),
        hashes=block_hashes(ids, 256),
        target_len=target,
        max_tokens=target,
        out_key=key,
        drawer=AcceptanceDrawer(PROF.cum_accept(GAMMA), "quasi", key),
        received_ns=int(clock() * 1e9),
    )


def run_until(eng: Engine, cond, limit: int = 100_000) -> None:
    for _ in range(limit):
        if cond():
            return
        assert eng.iterate(idle_wait=0.0)
    raise AssertionError("condition not reached")


def counter(eng: Engine, name: str) -> float:
    return eng.m.registry.get_sample_value(name, {"model_name": "m", "engine": "0"}) or 0.0


def truth(**kw) -> dict:
    args = dict(
        gamma=GAMMA, fp8_head=False, max_num_seqs=24, max_num_batched_tokens=8192, lpt_threshold=0
    )
    args.update(kw)
    return profmod.derived(PROF, **args)


def test_single_stream_rate_and_spec_counters_are_exact():
    eng, clock, _ = make_engine()
    r = make_req(eng, clock, 500, target=400)
    eng.submit(r)
    run_until(eng, lambda: r.first_token_ns is not None)
    t_first, drafts0 = clock(), counter(eng, "vllm:spec_decode_num_drafts_total")
    run_until(eng, lambda: r.finish_reason is not None)
    drafts = counter(eng, "vllm:spec_decode_num_drafts_total") - drafts0
    accepted = counter(eng, "vllm:spec_decode_num_accepted_tokens_total")
    # every verify step is one modelled batch-1 step, back to back
    assert clock() - t_first == pytest.approx(drafts * PROF.step_ms(1) / 1000, rel=1e-9)
    assert r.finish_reason == "length" and r.generated == 400
    # vLLM counts accepted drafts as sampled, before the last step is cut at max_tokens
    # (vllm/v1/core/sched/scheduler.py), so only that step can count more than it emitted.
    trimmed = 1 + drafts + accepted - counter(eng, "vllm:generation_tokens_total")
    assert 0 <= trimmed <= GAMMA and r.accepted == accepted and sum(r.spec_hist) == drafts
    assert counter(eng, "vllm:spec_decode_num_draft_tokens_total") == GAMMA * drafts
    per_pos = [
        eng.m.registry.get_sample_value(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            {"model_name": "m", "engine": "0", "position": str(k)},
        )
        for k in range(GAMMA)
    ]
    assert sum(per_pos) == accepted
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    tok_s = (r.generated - 1) / (clock() - t_first)
    assert tok_s == pytest.approx(truth()["single_stream_decode_tok_s"], rel=0.02)


def test_acceptance_marginals_follow_profile():
    eng, clock, _ = make_engine()
    reqs = [make_req(eng, clock, 64, seed=i) for i in range(8)]
    for r in reqs:
        eng.submit(r)
    for _ in range(400):
        eng.iterate(idle_wait=0.0)
    drafts = counter(eng, "vllm:spec_decode_num_drafts_total")
    assert drafts > 2000
    for k, expect in enumerate(PROF.cum_accept(GAMMA)):
        got = (
            eng.m.registry.get_sample_value(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                {"model_name": "m", "engine": "0", "position": str(k)},
            )
            / drafts
        )
        assert got == pytest.approx(expect, abs=0.01)


def decode_rate_beside_prefill(threshold: int) -> float:
    """Tokens/s of a decoding stream while a 200k-token prompt prefills next to it."""
    eng, clock, _ = make_engine(lpt_threshold=threshold)
    dec = make_req(eng, clock, 100, seed=1)
    eng.submit(dec)
    run_until(eng, lambda: dec.generated >= 20)
    long = make_req(eng, clock, 200_000, target=1, seed=2)
    eng.submit(long)
    g0, t0 = dec.generated, clock()
    run_until(eng, lambda: long.computed >= 180_000)  # full-size chunks only
    return (dec.generated - g0) / (clock() - t0)


def test_long_prefill_threshold_unstalls_decode():
    off, on = decode_rate_beside_prefill(0), decode_rate_beside_prefill(4096)
    ideal = (
        truth(lpt_threshold=4096)["decode_tok_s_beside_prefill"]
        / truth(lpt_threshold=0)["decode_tok_s_beside_prefill"]
    )
    assert on / off == pytest.approx(ideal, rel=0.08)
    assert on / off > 1.4  # the seed's +53%


@pytest.mark.parametrize("seqs", [16, 24])
def test_aggregate_ceiling_matches_seed(seqs):
    eng, clock, _ = make_engine(max_num_seqs=seqs)
    reqs = [make_req(eng, clock, 64, seed=i) for i in range(seqs + 6)]
    for r in reqs:
        eng.submit(r)
    run_until(eng, lambda: all(r.first_token_ns for r in reqs[:seqs]))
    assert len(eng.running) == seqs and len(eng.waiting) == 6
    assert counter(eng, "vllm:num_requests_waiting") == 6
    g0, t0 = sum(r.generated for r in reqs), clock()
    for _ in range(100):
        eng.iterate(idle_wait=0.0)
    agg = (sum(r.generated for r in reqs) - g0) / (clock() - t0)
    assert agg == pytest.approx({16: 108, 24: 131}[seqs], rel=0.03)


def test_prefix_cache_prefills_only_the_suffix():
    eng, clock, _ = make_engine()
    turn1 = list(range(1, 5001))
    a = make_req(eng, clock, turn1, target=3)
    eng.submit(a)
    run_until(eng, lambda: a.finish_reason is not None)
    b = make_req(eng, clock, turn1 + list(range(9000, 9600)), target=3)
    eng.submit(b)
    run_until(eng, lambda: b.finish_reason is not None)
    assert b.cached_tokens == (5000 // 256) * 256
    assert counter(eng, "vllm:prefix_cache_hits_total") == b.cached_tokens
    assert counter(eng, "vllm:prefix_cache_queries_total") == 5000 + 5600
    assert counter(eng, "vllm:prompt_tokens_total") == 5000 + 5600


def test_step_over_execute_timeout_kills_engine():
    eng, clock, deaths = make_engine(step_timeout_s=300.0, stall_steps={2: 400.0})
    r = make_req(eng, clock, 100, target=50)
    eng.submit(r)
    assert eng.iterate(idle_wait=0.0)
    t0 = clock()
    assert eng.iterate(idle_wait=0.0) is False
    assert deaths and "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=300" in deaths[0]
    assert clock() - t0 == pytest.approx(300.0, abs=0.5)
    assert r.events.get_nowait()[0] == "tokens"
    assert any(ev[0] == "error" for ev in list(r.events.queue))


def test_stop_string_and_determinism():
    eng, clock, _ = make_engine()
    a, b = make_req(eng, clock, 50, target=60, seed=7), make_req(eng, clock, 50, target=60, seed=7)
    for r in (a, b):
        eng.submit(r)
    run_until(eng, lambda: a.finish_reason and b.finish_reason)
    text = lambda r: "".join(ev[1] for ev in list(r.events.queue) if ev[0] == "tokens")  # noqa: E731
    assert text(a) == text(b) and len(text(a)) > 60
    stop_word = text(a).split()[5]
    c = make_req(eng, clock, 50, target=60, seed=7)
    c.stop = [stop_word]
    eng.submit(c)
    run_until(eng, lambda: c.finish_reason is not None)
    assert c.finish_reason == "stop" and stop_word not in text(c)
    assert text(a).startswith(text(c)) and c.generated < 60


def test_lone_prefill_time_matches_truth():
    for threshold in (0, 4096):
        eng, clock, _ = make_engine(lpt_threshold=threshold)
        r = make_req(eng, clock, 32768, target=1)
        eng.submit(r)
        t0 = clock()
        run_until(eng, lambda r=r: r.first_token_ns is not None)
        expect = truth(lpt_threshold=threshold)["lone_prefill_s_by_prompt_tokens"]["32768"]
        assert clock() - t0 == pytest.approx(expect, abs=2e-6)
