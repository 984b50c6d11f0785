"""End to end: `launch/dspark_launch.sh fleet` on five netns hosts: two REAL vLLM pairs (the
CPU build, TP=2 each, the tiny model; the `cpu` engine stack, as `make rehearse` runs), the
real vLLM router in the process runtime, real sshd with strict host keys.

One walk through a fleet's life, because each step needs the one before (and one fleet boot
per module: two real pairs are the suite's heaviest boot): up (both pairs in parallel, then
the router), conversations that stay on their pair, a pair's head killed mid-conversation
(the router moves only that pair's conversations, and only requests that were in flight on it
fail; its headless rank 1 stays up, as real vLLM's does), `up` again (the pair comes back, the
fleet is whole, its conversations return), and `down` (nothing left: no container, process
or /dev/shm segment, but a container the fleet does not own is untouched). No fleet command
prints the pairs' HF_TOKEN. Real vLLM names no pair in its replies, so which pair answered is
read off the pairs' own counters (sim/rehearsal/whichpair.py).

The walk runs twice, once per engine: the simulated pairs in the default suite (~1.5 min),
the real pairs outside it (`outside_suite`, `make test-outside`: 6-10 min of two real boots
at once on 2 cores, which the suite's ~12 min cannot hold; docs/testing.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.engine import local
from sim.rehearsal import fleet, fleet_env, hosts, leaks, memwatch, pairenv, provision
from sim.rehearsal.rehearse import LAUNCHER
from tests.support.real_engine import PAIR_BOOT_LIMIT_S

# Heavy: the simulated walk runs in the netns lane, the real one in the engine lane
# (tests/conftest.py).
pytestmark = [pytest.mark.needs_netns]

REPO = Path(__file__).resolve().parents[1]
ENGINES = [
    "sim",
    pytest.param("cpu", marks=[pytest.mark.needs_engine, pytest.mark.outside_suite]),
]
# Both pairs boot at once on the same cores: twice one pair's limit (5x its idle boot).
UP_LIMIT_S = 2 * PAIR_BOOT_LIMIT_S
FITS_KIB = 24 * 1024 * 1024  # the 2-core, 24 GiB machine the rehearsal is written for


@pytest.fixture(scope="module", params=ENGINES)
def fh(request: pytest.FixtureRequest) -> Iterator[fleet_env.FleetHosts]:
    engine = request.param
    model = local.built_model() if engine == "cpu" else None
    pair = provision.build_free_pair("dsv4fe", n_hosts=fleet_env.N_HOSTS)
    try:
        yield fleet_env.prepare(pair, REPO, engine=engine, model=model)
    finally:
        provision.teardown(pair)


def run(fh: fleet_env.FleetHosts, *args: str, timeout: float = 400) -> tuple[int, str]:
    argv = [str(LAUNCHER), "fleet", args[0], "--inventory", str(fh.inventory), *args[1:]]
    res = fh.router.run(argv, cwd=str(REPO), timeout=timeout, env={"PYTHONUNBUFFERED": "1"})
    out = res.stdout + res.stderr
    assert pairenv.FAKE_HF_TOKEN not in out, "a fleet command printed HF_TOKEN"
    return res.returncode, out


def up(fh: fleet_env.FleetHosts) -> tuple[int, str]:
    return run(fh, "up", "--timeout", str(UP_LIMIT_S), timeout=UP_LIMIT_S + 300)


def running(host: hosts.Host, name: str) -> bool:
    res = host.docker("inspect", "-f", "{{.State.Running}}", name)
    return res.returncode == 0 and res.stdout.strip() == "true"


def test_fleet_lifecycle_failover_and_recovery(fh: fleet_env.FleetHosts) -> None:
    t0 = time.monotonic()
    shm_before = set(leaks.shm_entries())
    # A container of another fleet on the router host: the fleet must never touch it.
    router_host: hosts.Host = fh.router
    pairenv.load_image(router_host)
    foreign = router_host.docker(
        "run", "-d", "--name", "other-fleet-router", "--label", "dsv4.fleet=other",
        "--network", "host", pairenv.IMAGE, "sleep", "900",
    )  # fmt: skip
    assert foreign.returncode == 0, foreign.stderr

    with memwatch.MemWatch(fh.pair.hosts) as mem:
        rc, out = up(fh)
        assert rc == 0, out
        boot_s = time.monotonic() - t0
        assert "bringing up pair-a, pair-b" in out and "router: started, ready, 2/2" in out
        assert "[pair-a] preflight:" in out and "[pair-b] preflight:" in out  # each its own

        rc, out = up(fh)
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
        assert all(rep.where(x) in ("pair-b", None) for x in rep.lost_in_flight)
        for s, home in rep.home.items():
            if home == "pair-a":
                assert s not in rep.moved, f"{s} lived on the survivor and must not move"
            else:
                assert rep.moved.get(s) == ["pair-a"], f"{s} should have moved to pair-a"
        if fh.engine == "cpu":
            # the premises of reading real pairs off their counters: the killed head is
            # silent, and the survivor's own counter finished every turn answered after the
            # kill (the simulator names its pair in a header instead)
            assert rep.counted_from is not None and rep.victim_answers is False
            assert (rep.survivor_finished or 0) >= rep.answered_since(rep.counted_from) > 0
        # real vLLM: a headless rank 1 whose head died never exits by itself
        assert running(fh.nodes("pair-b")[1], "dsv4-pair-b-rank1")

        rc, out = run(fh, "status", "--json")
        st = json.loads(out[out.index("{") :])
        assert st["router"]["workers_by_pair"] == {"pair-a": True, "pair-b": False}
        assert st["pairs"]["pair-b"]["healthy"] is False

        fleet.come_back(fh, rep, UP_LIMIT_S)  # fleet up again; both healthy; all back home

        rc, out = run(fh, "down")
        assert rc == 0, out
    ps = router_host.docker("ps", "-a", "--format", "{{json .}}").stdout.splitlines()
    assert [json.loads(x)["Names"] for x in ps] == ["other-fleet-router"]
    router_host.docker("rm", "-f", "other-fleet-router")
    fleet.check_nothing_left(fh, shm_before)  # containers, processes, /dev/shm segments
    print(
        f"\nfleet ({fh.engine}): up {boot_s:.0f} s, whole walk {time.monotonic() - t0:.0f} s; "
        + mem.peak.line()
    )
    assert mem.peak.samples > 0 and 0 < mem.peak.hosts_pss_max_kib < FITS_KIB
