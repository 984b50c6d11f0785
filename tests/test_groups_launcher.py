"""A group of four through the launcher: up, status, down and logs over four fake nodes.

The fake pair (tests/fakes/fakepair.py) with SPARK3/SPARK4 set and two more fake hosts
(h3, h4) behind the fake ssh: every rank is started, headless ranks first, every rank's
state is in `status`, a rank that fails to start tears down all four, and `down` removes
this pair's containers on every node and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.fakepair import Env, pair_endpoint

HOSTS = {"h2": "127.0.0.2", "h3": "127.0.0.3", "h4": "127.0.0.4"}


def quad(env: Env) -> Env:
    """Make the fake pair a group of four (h1 local; h2-h4 over ssh)."""
    env.values.update(SPARK3=HOSTS["h3"], SPARK4=HOSTS["h4"])
    env.write_env()
    for host, addr in HOSTS.items():
        env.state["hosts"][host] = json.loads(json.dumps(env.state["hosts"]["h2"]))
        env.state["hosts"][host]["addrs"] = [addr]
        env.state["ssh"][addr] = host
    env.save()
    return env


def _names(runs: list[dict]) -> list[tuple[str, str]]:
    return [(r["host"], r["argv"][r["argv"].index("--name") + 1]) for r in runs]


@pytest.fixture()
def group(tmp_path: Path, endpoint: int) -> Env:
    return quad(Env(tmp_path, endpoint))


def test_plan_of_four_lists_every_rank(group: Env) -> None:
    p = group.run("plan")
    assert p.returncode == 0, p.stderr
    for r in range(4):
        assert f"container dsv4-pair-a-rank{r}" in p.stdout
    assert "--nnodes 4" in p.stdout and "--tensor-parallel-size 4" in p.stdout


def test_up_starts_every_rank_headless_first_then_down_removes_all(group: Env) -> None:
    p = group.run("up")
    assert p.returncode == 0, p.stdout + p.stderr
    assert _names(group.runs()) == [
        ("h4", "dsv4-pair-a-rank3"),
        ("h3", "dsv4-pair-a-rank2"),
        ("h2", "dsv4-pair-a-rank1"),
        ("h1", "dsv4-pair-a-rank0"),
    ]
    for run in group.runs():
        argv = run["argv"]
        rank = argv[argv.index("--node-rank") + 1]
        assert f"dsv4.rank={rank}" in argv and argv[argv.index("--nnodes") + 1] == "4"
        assert ("--headless" in argv) == (rank != "0")
        env = group.load()["hosts"][run["host"]]["containers"]
        (mine,) = [c for c in env if c["Name"] == f"dsv4-pair-a-rank{rank}"]
        assert mine["Env"]["VLLM_HOST_IP"] == f"127.0.0.{int(rank) + 1}"

    s = group.run("status", "--json")
    doc = json.loads(s.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert all(r["state"] == "running" and r["reachable"] for r in doc["ranks"]), doc["ranks"]
    assert [r["addr"] for r in doc["ranks"]] == ["127.0.0.1", *HOSTS.values()]

    logs = group.run("logs", "--rank", "3")
    assert logs.returncode == 0, logs.stderr

    group.add_container("h3", "dsv4-pair-b-rank2", "pair-b", 2)  # another pair's
    d = group.run("down")
    assert d.returncode == 0, d.stderr
    state = group.load()["hosts"]
    for host in ("h1", *HOSTS):
        mine = [c for c in state[host]["containers"] if c["Labels"].get("dsv4.pair") == "pair-a"]
        assert mine == [], (host, mine)
    assert [c["Name"] for c in state["h3"]["containers"]] == ["dsv4-pair-b-rank2"]


def test_a_rank_that_dies_in_boot_tears_down_every_rank(group: Env) -> None:
    group.state["hosts"]["h3"]["run"] = "exited"  # rank 2's engine exits at once
    group.save()
    p = group.run("up")
    assert p.returncode == 4, p.stdout + p.stderr
    assert len(group.runs()) == 4  # every rank was started
    assert "FAIL: rank 2" in p.stderr
    assert "tearing down pair containers on all 4 nodes" in p.stderr
    for host in ("h1", *HOSTS):
        running = [
            c["Name"]
            for c in group.load()["hosts"][host]["containers"]
            if c["Labels"].get("dsv4.pair") == "pair-a" and c["State"] == "running"
        ]
        assert running == [], (host, running)


def test_status_names_an_unreachable_rank(group: Env) -> None:
    group.state["ssh"].pop(HOSTS["h4"])  # rank 3 no longer answers ssh
    group.save()
    s = group.run("status", "--json")
    doc = json.loads(s.stdout)
    r3 = doc["ranks"][3]
    assert r3["rank"] == 3 and not r3["reachable"] and r3["state"] == "unknown"
    assert doc["verdict"] != "healthy"


def test_preflight_judges_every_rank_and_names_the_one_that_fails(group: Env) -> None:
    group.state["hosts"]["h4"]["images"] = {}  # rank 3's node lacks the image
    group.save()
    p = group.run("preflight")
    assert p.returncode == 3, p.stdout + p.stderr
    for r in (1, 2, 3):
        assert f"rank 0 (127.0.0.1) and rank {r} (127.0.0.{r + 1})" in p.stderr
    fails = [ln for ln in p.stdout.splitlines() if ln.lstrip().startswith("FAIL")]
    assert fails and all("rank 3" in ln for ln in fails), fails
    # the summary counts the merged verdicts: one check failed (on rank 3), once
    assert ", 1 fail," in p.stdout.splitlines()[-1], p.stdout.splitlines()[-1]
    assert group.runs() == []  # preflight starts nothing


def test_logs_rank_beyond_the_group_is_a_usage_error(tmp_path: Path) -> None:
    with pair_endpoint() as srv:
        pair = Env(tmp_path, srv.port)
        p = pair.run("logs", "--rank", "2")
    assert p.returncode == 2 and "this pair has ranks 0-1" in p.stderr


def test_preflight_of_a_ring_pings_the_neighbour_links(group: Env, tmp_path: Path) -> None:
    group.values["CABLING"] = "ring"
    group.write_env()
    stub = tmp_path / "stub"
    stub.mkdir()
    ping = stub / "ping"
    # rank 2 -> rank 3's address fails; every other ping answers
    ping.write_text(
        '#!/bin/sh\n[ "$FAKE_HOST" = h3 ] && { echo "100% packet loss" >&2; exit 1; }\nexit 0\n'
    )
    ping.chmod(0o755)
    p = group.run("preflight", path_first=stub)
    line = next(ln for ln in p.stdout.splitlines() if "PF-RING-NEIGHBOURS" in ln)
    assert "FAIL" in line and "rank 2 -> rank 3 (127.0.0.4): 100% packet loss" in line, line
    assert p.returncode == 3


def test_sync_overlays_refuses_a_group_whose_rank3_is_spark1_under_another_name(
    group: Env,
) -> None:
    """The identity checks sync-overlays (and image ship, model fetch) run before they write
    to any node cover every headless rank, not only rank 1: SPARK4=localhost is SPARK1's
    127.0.0.1 by another name, which the env file's distinct-strings rule cannot see."""
    group.values["SPARK4"] = "localhost"
    group.write_env()
    sync = group.run("sync-overlays")
    assert sync.returncode == 3, sync.stdout + sync.stderr
    fails = [ln for ln in sync.stdout.splitlines() if "FAIL" in ln and "PF-DISTINCT-NODES" in ln]
    assert fails and "SPARK4" in sync.stdout, sync.stdout
    assert "nothing was copied" in sync.stderr
    assert not (group.tmp / "overlays").exists()
    assert not [c for c in group.calls("ssh") if "tar -C" in " ".join(c["argv"])]
