"""TP=N decode (perfmodel/group.py): N=2 is today's budget, N=4 halves weight bytes per rank
and pays the ring all-reduce's 2(N-1) latency steps and 2(N-1)/N bytes per link."""

from __future__ import annotations

import json

import pytest

from perfmodel import budget as B
from perfmodel import cli
from perfmodel import group as G


def test_two_nodes_reproduce_todays_step_exactly() -> None:
    inp = B.Inputs()
    assert G.step(inp, 2).total_ms == pytest.approx(B.step_ms(inp), abs=1e-9)
    assert G.nccl_ms(inp, 2) == pytest.approx(B.nccl_ms(inp), abs=1e-12)


def test_four_nodes_halve_the_weight_terms() -> None:
    inp = B.Inputs()
    comps = {c.name: c.ms for c in B.components(inp)}
    weights2 = sum(comps[k] for k in ("moe_experts", "draft_verify_heads", "dense_fp8_gemms"))
    weights2 += comps["weight_only_gemms"]
    assert G.step(inp, 4).weights_ms == pytest.approx(weights2 / 2)
    # a fully replicated dense share does not shrink
    full = G.step(inp, 4, replicated_share=1.0).weights_ms
    assert full - G.step(inp, 4).weights_ms == pytest.approx((10.5 + 7) / 2)


def test_allreduce_grows_as_the_ring_formula_says() -> None:
    inp = B.Inputs()
    hop = B.allreduce_latency_us(inp) / 2  # the seed's 2-rank all-reduce = 2 ring steps
    lat4 = 86 * 6 * hop * 1e-3  # 2(N-1) = 6 steps at N=4
    bytes4 = 86 * 6 * 4096 * 2 * 1.5 / 50e9 * 1e3  # 2(N-1)/N = 1.5 of M=6 rows, 2x200G
    assert G.nccl_ms(inp, 4) == pytest.approx(lat4 + bytes4)
    tree = G.nccl_ms(inp, 4, "tree")
    assert tree == pytest.approx(86 * 4 * hop * 1e-3 + bytes4)  # 2 log2(4) = 4 steps
    assert tree < G.nccl_ms(inp, 4)
    with pytest.raises(ValueError):
        G.step(inp, 4, fabric="ring", algo="tree")


def test_prediction_uses_tp2_acceptance_not_tp4_figures() -> None:
    inp = B.Inputs()
    rows = G.versus_peer(inp, 4, "switched", "ring", 0.0)
    ratio = G.step(inp, 2).total_ms / G.step(inp, 4).total_ms
    for r, (tp2, tp4) in zip(rows, ((87, 120), (66, 87), (42, 46)), strict=True):
        assert r["predicted"] == pytest.approx(tp2 * ratio, abs=0.01)
        assert r["ratio"] == pytest.approx(r["predicted"] / tp4, abs=1e-3)


def test_cli_nodes_flag_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--json", "-", "--mc-trials", "0"]) == 0
    assert "group" not in json.loads(capsys.readouterr().out)
    assert cli.main(["--json", "-", "--mc-trials", "0", "--nodes", "4"]) == 0
    g = json.loads(capsys.readouterr().out)["group"]
    assert g["nodes"] == 4 and g["allreduce_steps"] == 6 and len(g["versus_peer"]) == 3
    with pytest.raises(SystemExit) as e:
        cli.main(["--nodes", "4", "--fabric", "ring", "--allreduce", "tree"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["--nodes", "3"])
