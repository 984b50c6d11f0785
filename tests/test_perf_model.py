"""Tests of perfmodel/cli.py: the seed's figures, the expert-paging maths, edge cases.

Expected values come from the seed README's figures and from reasoning done here (the
hypergeometric miss probability, the 1 + q^6 identity), never from the model's own output.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from perfmodel import budget as B
from perfmodel import cli as perf_model
from perfmodel import levers as L
from perfmodel import paging as P

SEED_STEP_MS = 67.0
SEED_STEPS_PER_S = 14.5
SEED_TREE_RATIO = 1.85


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# --- the seed's figures, within 10% -------------------------------------------------------


def test_step_time_and_rate_match_seed() -> None:
    inp = B.Inputs()
    assert rel(B.step_ms(inp), SEED_STEP_MS) < 0.10
    assert rel(B.steps_per_s(inp), SEED_STEPS_PER_S) < 0.10


def test_budget_components_match_seed_breakdown() -> None:
    seed = {
        "moe_experts": 30,
        "dense_fp8_gemms": 10.5,
        "weight_only_gemms": 7,
        "draft_verify_heads": 4,
        "nccl": 4.5,
        "misc": 6,
    }
    got = {c.name: c.ms for c in B.components(B.Inputs())}
    for name, ms in seed.items():
        assert rel(got[name], ms) < 0.10, name
    # The seed's parts sum to 62 ms, not its 67 ms total: the gap must be shown, not hidden.
    assert got["unattributed"] == pytest.approx(67 - 62)


@pytest.mark.parametrize("alpha", [0.75, 0.8, 0.85])
def test_plausible_acceptance_lands_in_seed_band(alpha: float) -> None:
    tok = B.tok_s(B.Inputs(), B.Acceptance.geometric(alpha, 5))
    assert 45 * 0.9 <= tok <= 65 * 1.1


def test_seed_band_maps_to_plausible_alphas() -> None:
    inp = B.Inputs()
    lo, hi = B.alpha_for_tok_s(inp, 45), B.alpha_for_tok_s(inp, 65)
    assert 0.6 < lo < hi < 0.95
    # tok/s = steps/s x (accepted + 1), checked by hand at the low end.
    acc = B.Acceptance.geometric(lo, 5)
    assert B.steps_per_s(inp) * (1 + sum(lo**k for k in range(1, 6))) == pytest.approx(45, rel=1e-6)
    assert acc.mean_accept_len() == pytest.approx(1 + sum(lo**k for k in range(1, 6)))


@pytest.mark.parametrize("routing", B.ROUTING_MODES)
def test_width2_tree_costs_about_185x_moe(routing: str) -> None:
    inp = B.Inputs(routing=routing)
    ratio = B.moe_ms(replace(inp, tree_width=2)) / B.moe_ms(inp)
    assert rel(ratio, SEED_TREE_RATIO) < 0.10


def test_seed_tree_ratio_identity() -> None:
    # (1 - q^12) / (1 - q^6) = 1 + q^6 for the seed's formula with M 6 -> 12.
    q = 249 / 256
    assert P.distinct_seed(12) / P.distinct_seed(6) == pytest.approx(1 + q**6)
    assert rel(1 + q**6, SEED_TREE_RATIO) < 0.01


def test_aggregate_ceiling_anchor_and_shape() -> None:
    inp = B.Inputs()
    acc = B.Acceptance.geometric(B.REF_ALPHA, 5)
    per_seq = B.calibrated_per_seq_ms(inp)
    assert per_seq > 0
    assert B.aggregate_tok_s(inp, acc, 24, per_seq) == pytest.approx(131, rel=0.10)
    aggs = [B.aggregate_tok_s(inp, acc, b, per_seq) for b in range(1, 33)]
    assert all(b > a for a, b in zip(aggs, aggs[1:], strict=False))
    # more sequences never make one sequence faster
    steps = [B.step_ms(inp, b, per_seq) for b in range(1, 33)]
    per_stream = [acc.mean_accept_len() / s for s in steps]
    assert all(b < a for a, b in zip(per_stream, per_stream[1:], strict=False))
    # the bandwidth-only roofline is an upper bound on the calibrated curve
    assert all(B.aggregate_tok_s(inp, acc, b, 0.0) >= a for b, a in enumerate(aggs, 1))


# --- expert paging: closed form vs hypergeometric vs Monte-Carlo ------------------------


def test_exact_miss_probability_is_hypergeometric() -> None:
    assert math.comb(255, 6) / math.comb(256, 6) == pytest.approx(P.exact_base())
    assert P.exact_base() == pytest.approx(250 / 256)


def test_single_token_pages_its_own_experts() -> None:
    assert P.distinct_routed_exact(1) == pytest.approx(6)
    # the seed's base charges 7 = 6 routed + 1 shared at M=1
    assert P.distinct_seed(1) == pytest.approx(7)


@pytest.mark.parametrize("m", [1, 6, 12])
def test_monte_carlo_agrees_with_exact_closed_form(m: int) -> None:
    mc = P.monte_carlo_distinct(m, trials=3000, seed=7)
    exact = P.distinct_routed_exact(m)
    assert abs(mc.mean - exact) <= 5 * mc.stderr + 1e-9
    if m == 1:
        assert mc.mean == 6 and mc.stderr == 0
    else:
        # the seed's 249/256 lies far outside the simulation's noise
        assert P.distinct_seed(m) - mc.mean > 20 * mc.stderr


def test_sampled_sets_have_no_repeats_and_cover_range() -> None:
    import numpy as np

    sets = P._sample_topk_sets(np.random.default_rng(1), 20000, 256, 6)
    assert all(len(set(r)) == 6 for r in sets[:2000].tolist())
    counts = np.bincount(sets.ravel(), minlength=256)
    # each expert is picked 20000*6/256 ~ 469 times; uniformity within 6 sigma
    assert counts.min() > 469 - 6 * math.sqrt(469) and counts.max() < 469 + 6 * math.sqrt(469)


def test_distinct_is_monotone_and_bounded() -> None:
    prev = 0.0
    for m in range(1, 300):
        d = P.distinct_routed_exact(m)
        assert prev < d <= min(256, 6 * m) + 1e-9
        prev = d


def test_effective_tokens_inverts_distinct() -> None:
    for m in (1.0, 3.7, 12.0, 100.0):
        d = P.distinct_experts(m, P.exact_base())
        assert P.effective_tokens(d, P.exact_base()) == pytest.approx(m)


def test_seed_moe_time_implies_routing_locality() -> None:
    # 30 ms at 87% of 235 GB/s cannot hold 34 uniform experts of 3*4096*2048 MXFP4 params
    # per rank per layer; the model must say so rather than silently agree.
    expert = 3 * 4096 * 2048 * 4.25 / 8 / 2
    uniform_ms = 43 * P.distinct_routed_exact(6) * expert / (235e9 * 0.87) * 1e3
    inp = B.Inputs(routing="uniform")
    assert B.moe_ms(inp) == pytest.approx(uniform_ms)
    assert uniform_ms > 30 * 1.3
    rho = B.routing_independence(B.Inputs())
    assert 0 < rho < 1


# --- bandwidth, draft head, acceptance edge cases -----------------------------------------


def test_bandwidth_scaling() -> None:
    slow, fast = B.Inputs(), B.Inputs(hw=B.Hardware(bw_gbs=470.0))
    cs = {c.name: c.ms for c in B.components(slow)}
    cf = {c.name: c.ms for c in B.components(fast)}
    for name in ("moe_experts", "dense_fp8_gemms", "weight_only_gemms", "draft_verify_heads"):
        assert cf[name] == pytest.approx(cs[name] / 2), name
    for name in ("nccl", "misc", "unattributed"):
        assert cf[name] == pytest.approx(cs[name]), name
    assert B.step_ms(B.Inputs(hw=B.Hardware(bw_gbs=273.0))) < B.step_ms(slow)


def test_more_rails_only_shrink_the_allreduce_bytes() -> None:
    two, four = B.Inputs(), B.Inputs(hw=B.Hardware(rails=4))
    bytes_2rail_ms = 86 * 6 * 4096 * 2 / (2 * 25e9) * 1e3  # 86 all-reduces of M=6 rows
    assert B.nccl_ms(two) - B.nccl_ms(four) == pytest.approx(bytes_2rail_ms / 2)
    assert B.nccl_ms(two) == pytest.approx(4.5)


def test_fp8_draft_head_saves_the_seed_gemm_delta() -> None:
    fp8, bf16 = B.Inputs(), B.Inputs(draft_head_fp8=False)
    assert B.step_ms(bf16) - B.step_ms(fp8) == pytest.approx(2.73 - 1.45, rel=1e-6)


def test_acceptance_edges_and_rates_roundtrip() -> None:
    assert B.Acceptance.geometric(1.0, 5).mean_accept_len() == pytest.approx(6)
    assert B.Acceptance.geometric(0.0, 5).mean_accept_len() == pytest.approx(1)
    acc = B.Acceptance((0.9, 0.8, 0.7, 0.6, 0.5))
    back = B.Acceptance.from_rates(acc.rates())
    assert back.conditional == pytest.approx(acc.conditional)
    assert acc.mean_accepted() == pytest.approx(0.9 + 0.72 + 0.504 + 0.3024 + 0.1512)
    with pytest.raises(ValueError):
        B.Acceptance.from_rates([0.5, 0.6])
    with pytest.raises(ValueError):
        B.Acceptance((1.2,))


def test_more_drafts_page_more_experts() -> None:
    base = B.Inputs()
    wide = replace(base, model=replace(base.model, gamma=7))
    assert B.moe_ms(wide) > B.moe_ms(base)


# --- the CLI ------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = perf_model.main(list(args))
    return rc, capsys.readouterr().out


def test_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_cli(capsys, "--json", "-", "--mc-trials", "200", "--m", "1,6,12")
    assert rc == 0
    doc = json.loads(out)
    for key in (
        "schema_version",
        "inputs",
        "budget",
        "step_ms",
        "steps_per_s",
        "acceptance",
        "tok_s",
        "tok_s_band",
        "expert_paging",
        "tree",
        "aggregate",
        "seed_checks",
        "levers",
    ):
        assert key in doc, key
    assert doc["schema_version"] == 1
    assert {c["source"] for c in doc["budget"]} <= {"derived", "calibrated", "residual"}
    assert sum(c["ms"] for c in doc["budget"]) == pytest.approx(doc["step_ms"], abs=0.01)
    assert [r["m"] for r in doc["expert_paging"]] == [1, 6, 12]
    assert doc["tok_s"] == pytest.approx(
        doc["steps_per_s"] * doc["acceptance"]["mean_accept_len"], rel=1e-3
    )
    assert doc["aggregate"]["rows"][-1]["num_seqs"] == 24


def test_cli_flags_change_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    _, a = run_cli(capsys, "--json", "-", "--mc-trials", "0")
    _, b = run_cli(
        capsys,
        "--json",
        "-",
        "--mc-trials",
        "0",
        "--bw-gbs",
        "273",
        "--accept",
        "0.9,0.8,0.7,0.6,0.5",
        "--max-num-seqs",
        "8",
    )
    da, db = json.loads(a), json.loads(b)
    assert db["steps_per_s"] > da["steps_per_s"]
    by_hand = math.fsum(math.prod((0.9, 0.8, 0.7, 0.6, 0.5)[:k]) for k in range(1, 6))
    assert db["acceptance"]["mean_accepted"] == pytest.approx(by_hand, abs=1e-3)
    assert db["aggregate"]["rows"][-1]["num_seqs"] == 8
    assert da["expert_paging"][0]["monte_carlo"] is None


def test_cli_rejects_bad_acceptance(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        perf_model.main(["--accept", "0.9,0.8"])
    assert e.value.code == 2
    assert perf_model.main(["--accept-kind", "rate", "--accept", "0.5,0.6,0.4,0.3,0.2"]) == 2


def test_help_and_table_run_as_module() -> None:
    cmd = [sys.executable, "-m", "perfmodel"]
    h = subprocess.run([*cmd, "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "--max-num-seqs" in h.stdout
    t = subprocess.run([*cmd, "--mc-trials", "100"], capture_output=True, text=True)
    assert t.returncode == 0, t.stderr
    assert "verify steps/s" in t.stdout and "Monte-Carlo" in t.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--rails", "0"],  # was a ZeroDivisionError
        ["--link-gbps", "0"],
        ["--bw-gbs", "nan"],
        ["--bw-gbs", "-235"],
        ["--per-seq-ms", "-100"],  # was a negative ceiling
        ["--per-seq-ms", "inf"],
        ["--moe-eff", "1.5"],
        ["--gamma", "0"],
        ["--tree-width", "-1"],
        ["--max-num-seqs", "0"],
        ["--mc-trials", "-5"],
        ["--mc-seed", "-1"],
        ["--accept", "1.2"],
        ["--accept", "nan"],
        ["--spin-budget-ms", "-2"],
        ["--spin-budget-ms", "nan"],
    ],
)
def test_cli_rejects_nonsense_as_usage_errors(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        perf_model.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert args[0] in err and "must be" in err, err


def test_cli_usage_error_has_no_traceback() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "perfmodel", "--rails", "0"], capture_output=True, text=True
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "python -m perfmodel: error: argument --rails: must be a whole number >= 1" in p.stderr


# --- a chat turn's prefill floor (perfmodel/turn.py) --------------------------------------


def test_turn_floor_pages_every_expert_and_stays_under_the_seeds_cached_ttft() -> None:
    """A 300-token turn pages in (almost) all 256 experts per layer: 43 layers x 256 x the
    per-rank expert bytes over 87% of 235 GB/s is ~360 ms, and the whole floor stays below
    the seed's cached multi-turn TTFT (0.47 s), which also holds tokenizing and scheduling."""
    from perfmodel.turn import tokenize_ms, turn_floor

    inp = B.Inputs()
    f = turn_floor(inp, 300)
    assert f.experts_per_layer > 250
    all_experts_ms = 43 * 256 * inp.model.expert_bytes_per_rank() / (235e9 * 0.87) * 1e3
    assert rel(f.moe_ms, all_experts_ms) < 0.01
    assert 300 < f.total_ms < 470
    # more new tokens page nothing more: the floor is flat past a few hundred tokens
    assert rel(turn_floor(inp, 4000).total_ms, f.total_ms) < 0.01
    # fewer tokens page fewer experts
    assert turn_floor(inp, 20).moe_ms < 0.8 * f.moe_ms
    assert tokenize_ms(100_000, 59.0) == pytest.approx(590.0)


# --- the decode levers (perfmodel/levers.py, perfmodel/anchors.py) -------------------------

PEER_SPIN = (67.8, 74.5)  # MiaAI-Lab #79: decode tok/s with busy_loop_s 1 s, then 2 ms
PEER_GRAPHS = (74.6, 95.9)  # MiaAI-Lab results/RESULTS-2026-08-14.md: breakable, regular


def test_a_spin_budget_buys_the_peers_ratio_and_vllms_second_buys_nothing() -> None:
    acc = B.Acceptance.geometric(0.8, 5)
    base = B.tok_s(B.Inputs(), acc)
    assert B.tok_s(B.Inputs(spin_budget_ms=2), acc) / base == pytest.approx(
        PEER_SPIN[1] / PEER_SPIN[0]
    )
    # A budget as long as vLLM's own 1 s never parks a reader between 67 ms steps.
    assert B.tok_s(B.Inputs(spin_budget_ms=1000), acc) == pytest.approx(base)
    # The seed's 131 tok/s ceiling was measured spinning: its calibration must not move.
    assert B.calibrated_per_seq_ms(B.Inputs(spin_budget_ms=2)) == pytest.approx(
        B.calibrated_per_seq_ms(B.Inputs())
    )
    (row,) = [c for c in B.components(B.Inputs(spin_budget_ms=2)) if c.name == "spin_budget"]
    assert row.ms < 0 and row.source == "calibrated"
    assert "spin_budget" not in {c.name for c in B.components(B.Inputs())}


def test_regular_graphs_lever_is_the_peers_ratio_at_our_step() -> None:
    acc = B.Acceptance.geometric(0.8, 5)
    lv = L.cuda_graphs(B.Inputs(), acc)
    breakable, regular = lv["model"]["tok_s"]
    assert regular == pytest.approx(B.tok_s(B.Inputs(), acc), abs=0.01)
    assert regular / breakable == pytest.approx(PEER_GRAPHS[1] / PEER_GRAPHS[0], rel=1e-3)
    assert lv["kind"] == "calibrated" and "cpu" not in lv["stacks"]  # the rehearsal is eager


def test_adaptive_verification_never_loses_and_follows_acceptance() -> None:
    inp, per_seq = B.Inputs(), B.calibrated_per_seq_ms(B.Inputs())
    # A drafter that is always right: verifying every draft is best, nothing to gain.
    perfect = L.adaptive_verification(inp, B.Acceptance.geometric(1.0, 5), per_seq)
    assert all(r["best_drafts"] == 5 and r["change"] == 0 for r in perfect["model"]["rows"])
    # One that is always wrong: verify no draft; one stream gains exactly the step-time
    # ratio (one token per step either way).
    wrong = L.adaptive_verification(inp, B.Acceptance.geometric(0.0, 5), per_seq)
    one = wrong["model"]["rows"][0]
    bare = replace(inp, model=replace(inp.model, gamma=0))
    assert one["num_seqs"] == 1 and one["best_drafts"] == 0
    assert one["change"] == pytest.approx(B.step_ms(inp) / B.step_ms(bare) - 1, abs=1e-5)
    # The tool-call collapse (ecohash-co README: per-position rates .914/.224/0/0/0)
    dsml = L.adaptive_verification(inp, B.Acceptance.from_rates([0.914, 0.224, 0, 0, 0]), per_seq)
    assert all(r["best_drafts"] <= 2 and r["change"] > 0 for r in dsml["model"]["rows"])
    assert dsml["kind"] == "derived" and dsml["stacks"] == []


def test_levers_in_the_json_carry_their_sources(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_cli(capsys, "--json", "-", "--mc-trials", "0", "--spin-budget-ms", "2")
    assert rc == 0
    doc = json.loads(out)
    assert {lv["kind"] for lv in doc["levers"]} == {"calibrated", "derived"}
    sources = " ".join(m["source"] for lv in doc["levers"] for m in lv["measured"])
    for cite in ("#79", "#71", "vllm-project/vllm#51950", "RESULTS-2026-08-14.md", "#52362"):
        assert cite in sources, cite
    spin = doc["levers"][0]
    assert spin["measured"][0]["before"] == PEER_SPIN[0]
    assert spin["model"]["spinning_readers"] == {"head": 2, "worker": 0}
    # --spin-budget-ms puts the term in the budget itself
    assert "spin_budget" in {c["name"] for c in doc["budget"]}
    assert sum(c["ms"] for c in doc["budget"]) == pytest.approx(doc["step_ms"], abs=0.01)
