"""Pieces of the fleet rehearsal on their own: the failover report's bookkeeping, the
runtime's image ENTRYPOINT (how the router "image" runs vllm-router), and the inventory the
rehearsal writes (it must be one the fleet command accepts)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from pairctl.fleet.inventory import parse_inventory
from sim.rehearsal import fleet_env
from sim.rehearsal.failover import Report, Turn, classify

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "sim" / "rehearsal" / "bin" / "docker"


def t(session: str, t0: float, pair: str | None, ok: bool) -> Turn:
    return Turn(session, 0, t0, t0 + 0.5, pair, ok, "" if ok else "broken")


def test_failover_report_sorts_failures_and_moves() -> None:
    home = {"s-a": "pair-a", "s-b": "pair-b", "s-c": "pair-b"}
    turns = [
        t("s-a", 1.0, "pair-a", True),
        t("s-b", 1.0, "pair-b", True),
        t("s-c", 1.0, "pair-b", True),
        t("s-b", 9.5, "pair-b", False),  # in flight on the victim at the kill: expected
        t("s-c", 9.8, None, False),  # sent before the kill, no answer at all: in flight
        t("s-a", 9.9, "pair-a", False),  # failed on the survivor: not excusable
        t("s-b", 10.2, "pair-a", True),
        t("s-c", 10.3, None, False),  # sent after the kill and failed: not excusable
        t("s-c", 10.6, "pair-a", True),
        t("s-a", 10.4, "pair-a", True),
    ]
    rep = classify(Report("pair-b", home, turns, kill_at=10.0, marked_down_s=1.2))
    assert [(x.session, x.t0) for x in rep.lost_in_flight] == [("s-b", 9.5), ("s-c", 9.8)]
    assert [(x.session, x.t0) for x in rep.unexpected] == [("s-a", 9.9), ("s-c", 10.3)]
    assert rep.moved == {"s-b": ["pair-a"], "s-c": ["pair-a"]}
    text = "\n".join(rep.lines())
    assert "marked it down after 1.2 s" in text and "in flight on pair-b when it died: 2" in text


def test_rehearsal_inventory_is_a_valid_fleet(tmp_path: Path) -> None:
    """What sim/rehearsal/fleet_env.py writes must pass the fleet's own validation."""
    from sim.rehearsal.hosts import Host, Pair

    hosts = [Host(f"x-h{i}", i - 1, f"10.1.2.{i}", "x-if0", tmp_path) for i in range(1, 6)]
    pair = Pair("x", tmp_path, "10.1.2.0/24", "x-br0", "10.1.2.254", hosts)
    (tmp_path / "client").mkdir()
    env_files = {}
    for i, pid in enumerate(fleet_env.PAIR_IDS):
        lines = [
            f"PAIR_ID={pid}",
            f"SPARK1={hosts[2 * i].ip}",
            f"SPARK2={hosts[2 * i + 1].ip}",
            "MODEL_PATH=/m",
            "NCCL_SOCKET_IFNAME=x-if0",
            "GLOO_SOCKET_IFNAME=x-if0",
        ]
        env_files[pid] = tmp_path / "client" / f"{pid}.env"
        env_files[pid].write_text("\n".join(lines) + "\n")
    fh = fleet_env.FleetHosts(pair, tmp_path / "client" / "fleet.yaml", env_files)
    data = fleet_env.inventory(fh, REPO, fleet_env.REHEARSAL_TUNING)
    f = parse_inventory(yaml.safe_load(yaml.safe_dump(data)), fh.inventory)
    assert f.router.url == fh.router_url == "http://10.1.2.5:8080"
    assert [p.endpoint for p in f.pairs] == [fh.endpoint("pair-a"), fh.endpoint("pair-b")]
    assert f.router.tuning.health_check_interval_s == 1


@pytest.mark.needs_root
def test_image_entrypoint_runs_before_the_run_arguments(tmp_path: Path) -> None:
    """docker runs the image's ENTRYPOINT with the `run` arguments appended; the fleet's
    router line relies on it (the router image's entrypoint is vllm-router)."""
    st = tmp_path / "state"
    st.mkdir()
    env = {**os.environ, "DSV4R_DOCKER_STATE": str(st)}

    def docker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(DOCKER), *args], env=env, capture_output=True, text=True)

    assert docker("load-fake", "ep:1", "ab" * 32, "--entrypoint", "sleep").returncode == 0
    res = docker("run", "-d", "--name", "ep", "--network", "host", "ep:1", "30")
    try:
        assert res.returncode == 0, res.stderr
        info = json.loads(docker("inspect", "ep").stdout)[0]
        assert info["Path"] == "sleep" and info["Args"] == ["30"]
        assert info["Config"]["Entrypoint"] == ["sleep"] and info["Config"]["Cmd"] == ["30"]
        assert info["State"]["Running"] is True
    finally:
        docker("rm", "-f", "ep")
    assert docker("load-fake", "none:1", "cd" * 32).returncode == 0
    res = docker("run", "-d", "--name", "none", "--network", "host", "none:1")
    assert res.returncode == 125 and "no command specified" in res.stderr
