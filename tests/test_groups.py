"""A group of four Sparks: the env file's rules and what resolve/plan make of it.

A pair stays the default (tests/test_plan_golden.py pins its plan byte for byte); these
tests pin what SPARK3/SPARK4 change: per-rank argv, labels, the TP size and its plan note,
the cabling's container env, and the rules that make a bad group an exit-2 error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pairctl.pair import cabling
from pairctl.pair.config import ConfigError, parse_env
from pairctl.pair.plan import build_rank, render_plan
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve

REPO = Path(__file__).resolve().parents[1]
RECIPE = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
PAIR = {
    "PAIR_ID": "quad",
    "SPARK1": "10.0.0.11",
    "SPARK2": "10.0.0.12",
    "MODEL_PATH": "/srv/m",
    "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
    "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
    "SSH_USER": "op",
}
QUAD = dict(
    PAIR,
    SPARK3="10.0.0.13",
    SPARK4="10.0.0.14",
    FABRIC1="192.168.192.1",
    FABRIC2="192.168.192.2",
    FABRIC3="192.168.192.3",
    FABRIC4="192.168.192.4",
)


def _arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_pair_is_the_default() -> None:
    p = resolve(parse_env(PAIR), RECIPE)
    assert p.nnodes == 2 and list(p.ranks) == [0, 1] and len(p.nodes) == 2
    assert p.cabling_env == () and _arg(p.vllm_argv[1], "--tensor-parallel-size") == "2"


@pytest.mark.parametrize("only", ["SPARK3", "SPARK4"])
def test_spark3_and_spark4_both_or_neither(only: str) -> None:
    with pytest.raises(ConfigError, match=f"{only} is set but .* not; a group is 2 or 4"):
        parse_env(dict(PAIR, **{only: "10.0.0.13"}))


def test_every_address_distinct() -> None:
    with pytest.raises(ConfigError, match="SPARK4 and SPARK2 are both 10.0.0.12"):
        parse_env(dict(QUAD, SPARK4="10.0.0.12"))
    with pytest.raises(ConfigError, match="FABRIC3 and FABRIC1 are both 192.168.192.1"):
        parse_env(dict(QUAD, FABRIC3="192.168.192.1"))
    # a defaulted FABRIC is its SPARK: it must not clash with another rank's FABRIC
    with pytest.raises(ConfigError, match="FABRIC4 and FABRIC2"):
        parse_env(dict(QUAD, FABRIC4="", FABRIC2="10.0.0.14"))


def test_fabric3_without_a_group_and_a_ring_of_two_are_refused() -> None:
    with pytest.raises(ConfigError, match="FABRIC3 is set without SPARK3/SPARK4"):
        parse_env(dict(PAIR, FABRIC3="192.168.192.3"))
    with pytest.raises(ConfigError, match="CABLING=ring needs four Sparks"):
        parse_env(dict(PAIR, CABLING="ring"))
    with pytest.raises(ConfigError, match="CABLING='mesh' must be one of switched, ring"):
        parse_env(dict(QUAD, CABLING="mesh"))


def test_fabric_defaults_to_spark() -> None:
    cfg = parse_env(dict(QUAD, FABRIC3="", FABRIC4=""))
    assert cfg.nnodes == 4
    assert [cfg.fabric_addr(r) for r in range(4)] == [
        "192.168.192.1",
        "192.168.192.2",
        "10.0.0.13",
        "10.0.0.14",
    ]


def test_group_of_four_argv_per_rank() -> None:
    p = resolve(parse_env(QUAD), RECIPE)
    assert p.nnodes == 4 and list(p.ranks) == [0, 1, 2, 3] and list(p.headless_ranks) == [1, 2, 3]
    assert len(p.nodes) == len(p.placeholders) == len(p.vllm_argv) == 4
    assert [n.remote for n in p.nodes] == [False, True, True, True]
    assert [p.node_addr(r) for r in p.ranks] == ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"]
    assert p.spark2 == "10.0.0.12" and p.fabric2 == "192.168.192.2"
    assert p.ssh_target == "op@10.0.0.12"
    for r in p.ranks:
        argv = p.vllm_argv[r]
        assert _arg(argv, "--node-rank") == str(r)
        assert _arg(argv, "--nnodes") == "4" and _arg(argv, "--tensor-parallel-size") == "4"
        assert _arg(argv, "--master-addr") == "192.168.192.1"
        assert ("--headless" in argv) == (r != 0)
        rp = build_rank(p, r)
        assert rp.env["VLLM_HOST_IP"] == f"192.168.192.{r + 1}"
        assert rp.name == f"dsv4-quad-rank{r}"
        labels = {a for i, a in enumerate(rp.docker_argv) if rp.docker_argv[i - 1] == "--label"}
        assert {"dsv4.pair=quad", f"dsv4.rank={r}", f"dsv4.plan={p.plan_hash}"} <= labels
        assert f"dsv4.role={'head' if r == 0 else 'worker'}" in labels
        assert rp.node == p.node_addr(r)
    with pytest.raises(ConfigError, match="rank must be 0..3"):
        build_rank(p, 4)


def test_ssh_reaches_each_rank_at_its_own_address() -> None:
    p = resolve(parse_env(QUAD), RECIPE)
    for r in p.headless_ranks:
        argv = p.nodes[r].ssh_argv("true")
        assert argv[argv.index("--") - 1] == p.node_addr(r) and "StrictHostKeyChecking=yes" in argv


def test_plan_of_four_notes_tp_and_lists_every_rank() -> None:
    p = resolve(parse_env(QUAD), RECIPE)
    text = render_plan(p)
    assert "--tensor-parallel-size: 2 -> 4: a group of 4 Sparks" in text
    assert "start rank 3, start rank 2, start rank 1, start rank 0" in text
    heads = [line for line in text.splitlines() if line.startswith("## rank")]
    assert [h.split()[2] for h in heads] == ["3", "2", "1", "0"]
    assert "via ssh op@10.0.0.14 (SPARK4)" in heads[0]
    # the plan hash sees the group: a pair with the same first two nodes differs
    assert p.plan_hash != resolve(parse_env(PAIR), RECIPE).plan_hash


@pytest.mark.parametrize("wiring", [cabling.SWITCHED, cabling.RING])
def test_cabling_env_reaches_every_rank_with_its_source(wiring: str) -> None:
    p = resolve(parse_env(dict(QUAD, CABLING=wiring)), RECIPE)
    want = cabling.SETTINGS[wiring]
    assert want and p.cabling_env == want
    for r in p.ranks:
        env = build_rank(p, r).env
        assert all(env[s.name] == s.value for s in want)
    text = render_plan(p)
    for s in want:
        assert f"env {s.name}={s.value}: cabling {wiring} ({s.source})" in text
    other = cabling.RING if wiring == cabling.SWITCHED else cabling.SWITCHED
    only_other = {s.name for s in cabling.SETTINGS[other]} - {s.name for s in want}
    assert not only_other & set(build_rank(p, 0).env)


def test_links_head_to_every_rank_and_ring_neighbours() -> None:
    assert cabling.links(cabling.SWITCHED, 2) == ((0, 1),)
    assert cabling.links(cabling.SWITCHED, 4) == ((0, 1), (0, 2), (0, 3))
    assert cabling.links(cabling.RING, 4) == ((0, 1), (0, 2), (0, 3), (1, 2), (2, 3))


def test_status_names_a_rank_of_another_boot() -> None:
    from pairctl.status.pair import DEGRADED, HEALTHY, EndpointStatus, RankStatus, verdict

    def rank(r: int, boot: str) -> RankStatus:
        role = "head" if r == 0 else "worker"
        name = f"dsv4-quad-rank{r}"
        return RankStatus(
            r, role, f"10.0.0.1{r + 1}", True, "", name, "running", None, None, [], "p", boot
        )

    ep = EndpointStatus("http://10.0.0.11:8000/v1", True, "ok", ["m"], False, True, ours="yes")
    same = [rank(r, "b1") for r in range(4)]
    assert verdict(same, ep) == (HEALTHY, [])
    odd = [*same[:2], rank(2, "b0"), same[3]]
    name, reasons = verdict(odd, ep)
    assert name == DEGRADED and reasons == [
        "rank 2 (10.0.0.13): runs boot b0, the head boot b1: not part of the engine that "
        "serves; run down, then up"
    ]


def test_watch_waits_for_ssh_when_any_headless_rank_is_lost() -> None:
    from pairctl.nodes.pressure import NodeMemory
    from pairctl.status.memory import ssh_lost

    ok = [NodeMemory.unknown(r, f"10.0.0.1{r + 1}", "", reachable=True) for r in range(3)]
    lost = NodeMemory.unknown(3, "10.0.0.14", "Connection timed out during banner exchange")
    assert ssh_lost(ok) is None
    assert ssh_lost([*ok, lost]) == (
        "ssh to rank 3 (10.0.0.14) failed: Connection timed out during banner exchange"
    )


def test_argv_check_reads_every_ranks_verdict() -> None:
    import json

    from pairctl.preflight.argcheck import MARK, parse_output

    ok = {"ok": True, "flag": "", "error": ""}
    bad = {"ok": False, "flag": "--headless", "error": "unrecognized arguments: --headless"}
    text = MARK + json.dumps({"vllm": "0.33.0", "results": [ok, ok, ok, bad]})
    res = parse_output(text, "image x", RECIPE, [], 4)
    assert len(res.errors) == 1 and res.errors[0].startswith("rank 3: ")
    text = MARK + json.dumps({"vllm": "0.33.0", "results": [bad] * 4})
    assert parse_output(text, "image x", RECIPE, [], 4).errors[0].startswith("every rank: ")
