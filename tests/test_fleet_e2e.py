"""End to end: `launch/dspark_launch.sh fleet` on five netns hosts (two simulated pairs, the
real vLLM router in the process runtime, real sshd with strict host keys).

One walk through a fleet's life, because each step needs the one before: up (both pairs in
parallel, then the router), conversations that stay on their pair, a pair killed
mid-conversation (the router moves only that pair's conversations, and only requests that
were in flight on it fail), `up` again (the pair comes back, the fleet is whole, its
conversations return), and `down` (nothing left, but a container the fleet does not own is
untouched). No fleet command prints the pairs' HF_TOKEN.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.rehearsal import fleet, fleet_env, hosts, pairenv, provision
from sim.rehearsal.rehearse import LAUNCHER

pytestmark = pytest.mark.needs_netns

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fh() -> Iterator[fleet_env.FleetHosts]:
    pair = provision.build_free_pair("dsv4fe", n_hosts=fleet_env.N_HOSTS)
    try:
        yield fleet_env.prepare(pair, REPO)
    finally:
        provision.teardown(pair)


def run(fh: fleet_env.FleetHosts, *args: str, timeout: float = 400) -> tuple[int, str]:
    argv = [str(LAUNCHER), "fleet", args[0], "--inventory", str(fh.inventory), *args[1:]]
    res = fh.router.run(argv, cwd=str(REPO), timeout=timeout, env={"PYTHONUNBUFFERED": "1"})
    out = res.stdout + res.stderr
    assert pairenv.FAKE_HF_TOKEN not in out, "a fleet command printed HF_TOKEN"
    return res.returncode, out


def test_fleet_lifecycle_failover_and_recovery(fh: fleet_env.FleetHosts) -> None:
    # A container of another fleet on the router host: the fleet must never touch it.
    router_host: hosts.Host = fh.router
    pairenv.load_image(router_host)
    foreign = router_host.docker(
        "run", "-d", "--name", "other-fleet-router", "--label", "dsv4.fleet=other",
        "--network", "host", pairenv.IMAGE, "sleep", "600",
    )  # fmt: skip
    assert foreign.returncode == 0, foreign.stderr

    rc, out = run(fh, "up", "--timeout", "300")
    assert rc == 0, out
    assert "bringing up pair-a, pair-b" in out and "router: started, ready, 2/2" in out
    assert "[pair-a] preflight:" in out and "[pair-b] preflight:" in out  # each its own

    rc, out = run(fh, "up", "--timeout", "300")
    assert rc == 0 and "2 of 2 pair(s) healthy; bringing up none" in out, out
    assert "router: already running" in out

    where = fleet.conversations(fh, fleet.SESSIONS[:4], 3)
    assert set(where.values()) <= set(fleet_env.PAIR_IDS)

    rep = fleet.run_failover(fh, victim="pair-b")
    t = fleet_env.REHEARSAL_TUNING
    assert rep.marked_down_s is not None
    limit = t["health_check_interval_s"] * (t["health_failure_threshold"] + 1) + 3
    assert rep.marked_down_s <= limit, "the router's health checks should have noticed"
    assert rep.unexpected == [], [(x.session, x.n, x.pair, x.error) for x in rep.unexpected]
    assert all(x.pair in ("pair-b", None) for x in rep.lost_in_flight)
    for s, home in rep.home.items():
        if home == "pair-a":
            assert s not in rep.moved, f"{s} lived on the survivor and must not move"
        else:
            assert rep.moved.get(s) == ["pair-a"], f"{s} should have moved to pair-a"

    rc, out = run(fh, "status", "--json")
    st = json.loads(out[out.index("{") :])
    assert st["router"]["workers_by_pair"] == {"pair-a": True, "pair-b": False}
    assert st["pairs"]["pair-b"]["healthy"] is False

    fleet.come_back(fh, rep)  # fleet up again; both healthy; every conversation home

    rc, out = run(fh, "down")
    assert rc == 0, out
    ps = router_host.docker("ps", "-a", "--format", "{{json .}}").stdout.splitlines()
    assert [json.loads(x)["Names"] for x in ps] == ["other-fleet-router"]
    router_host.docker("rm", "-f", "other-fleet-router")
    fleet.check_nothing_left(fh)
