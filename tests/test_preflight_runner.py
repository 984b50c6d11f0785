"""Preflight's runner (pairctl/preflight/runner.py) and the staged gather
(pairctl/preflight/probe.py):
each check reported as soon as its evidence is in, the same verdicts as decide(), no PASS
about a node whose name does not resolve, and a heartbeat while a probe hangs."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from pairctl.pair.config import parse_env
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight import CHECKS, FAIL, PASS, SKIP, WARN, Need, decide, probe, runner
from pairctl.preflight.check import Inputs
from pairctl.preflight.evidence import ArgvCheck, Evidence, NodeEvidence
from pairctl.preflight.imageprobe import ImageProbe
from pairctl.preflight.reach import Reach

REPO = Path(__file__).resolve().parents[1]
RECIPE = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
CFG = parse_env(
    {
        "PAIR_ID": "pair-a",
        "SPARK1": "10.0.0.1",
        "SPARK2": "10.0.0.2",
        "MODEL_PATH": "/models/dsv4",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "IMAGE": "img:1",
    }
)
RESOLVED = {
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "FABRIC1": "10.0.0.1",
    "FABRIC2": "10.0.0.2",
    "MASTER_ADDR": "10.0.0.1",
}


def node(addr: str) -> NodeEvidence:
    return NodeEvidence(
        complete=True,
        reachable=True,
        rc=0,
        addrs=[addr],
        ifaddrs={"eth0": [addr]},
        netdevs=["lo", "eth0"],
        docker_ps_rc=0,
        image_id="sha256:1",
        model_dir=True,
        model_files={"config.json": "a"},
        tilelang_ok=True,
        overlay_dir=True,
        overlay_files={"a.py": "x"},
    )


def staged(resolved: dict, n0: NodeEvidence, n1: NodeEvidence, order=("rank0", "rank1")):
    """A gather() stand-in that delivers the evidence in stages, recording what was emitted
    by the time each stage arrived."""
    emitted: list[str] = []
    seen_at: dict[str, list[str]] = {}

    def fake_gather(
        pair,
        on_stage,
        progress,
        probe_rank1=True,
        check_args=False,
        local_argv=None,
        check_reach=False,
        check_image=False,
    ):
        ev = Evidence(config=dict(pair.evidence_config), resolved=resolved, image="img:1")
        seen_at["before"] = list(emitted)
        on_stage(probe.NAMES, ev)
        seen_at[probe.NAMES] = list(emitted)
        for stage in order:
            key, n = ("0", n0) if stage == "rank0" else ("1", n1)
            ev = replace(ev, nodes={**ev.nodes, key: n})
            on_stage(stage, ev)
            seen_at[stage] = list(emitted)
            if stage == "rank0" and check_args:  # the image's parser, as gather
                ev = replace(ev, argv_check=ArgvCheck("image img:1", True))
                on_stage(probe.ARGV, ev)
                seen_at[probe.ARGV] = list(emitted)
        if check_reach and len(order) == 2:  # the reach test, once both probes are in
            ev = replace(ev, reach=Reach(ran=True, ok=True, peer="10.0.0.2"))
            on_stage(probe.REACH, ev)
            seen_at[probe.REACH] = list(emitted)
        if check_image:  # the image probe, once every probed node's is in
            ran = ImageProbe("rank 0 (10.0.0.1)", "sha256:aa", "python3", True, "", False, None)
            ev = replace(ev, image_probes={"0": ran})
            on_stage(probe.IMAGE, ev)
            seen_at[probe.IMAGE] = list(emitted)
        return ev

    return fake_gather, emitted, seen_at


def run_staged(monkeypatch, resolved, n0, n1, order=("rank0", "rank1")):
    fake, emitted, seen_at = staged(resolved, n0, n1, order)
    monkeypatch.setattr(runner, "gather", fake)
    pair = resolve(CFG, RECIPE)
    checks, evidence = runner.run(pair, {"a.py": "x"}, lambda c: emitted.append(c.id))
    return checks, evidence, emitted, seen_at


def stages_needed(spec) -> set[str]:
    return {runner.STAGE_OF[n] for n in spec.needs}


@pytest.mark.parametrize("order", [("rank0", "rank1"), ("rank1", "rank0")])
def test_each_check_is_emitted_when_its_evidence_arrives(monkeypatch, order) -> None:
    checks, evidence, emitted, seen_at = run_staged(
        monkeypatch, RESOLVED, node("10.0.0.1"), node("10.0.0.2"), order
    )
    assert seen_at["before"] == []
    names_only = [s.id for s in CHECKS if stages_needed(s) == {"names"}]
    assert seen_at["names"] == names_only
    first = {s.id for s in CHECKS if stages_needed(s) <= {"names", order[0]}}
    assert set(seen_at[order[0]]) == first
    assert sorted(emitted) == sorted(s.id for s in CHECKS) and len(set(emitted)) == len(emitted)
    # streaming changes when a verdict is shown, never what it is, nor the report order
    assert checks == decide(resolve(CFG, RECIPE), evidence, {"a.py": "x"})


def test_without_rank1_probe_rank1_checks_are_decided_at_the_end(monkeypatch) -> None:
    unreached = NodeEvidence(rc=255, stderr="ssh: connect: Connection timed out")
    checks, _, _, _ = run_staged(
        monkeypatch, RESOLVED, node("10.0.0.1"), unreached, order=("rank0",)
    )
    by = {c.id: c.status for c in checks}
    assert by["PF-SSH"] == FAIL and by["PF-FOREIGN-PAIR"] == SKIP
    assert by["PF-SELF-IS-SPARK1"] == PASS and by["PF-DISTINCT-NODES"] == PASS


def test_unresolvable_spark1_turns_its_passes_into_skips(monkeypatch) -> None:
    resolved = dict(RESOLVED, SPARK1=None)
    checks, evidence, _, _ = run_staged(monkeypatch, resolved, node("10.0.0.1"), node("10.0.0.2"))
    specs = {s.id: s for s in CHECKS}
    inputs = Inputs(resolve(CFG, RECIPE), evidence, {"a.py": "x"})
    for c in checks:
        if Need.RANK0 in specs[c.id].needs:
            assert c.status in (SKIP, FAIL, WARN), c
            if specs[c.id].run(inputs).status == PASS:  # the check alone would have passed
                assert c.status == SKIP and "SPARK1 (10.0.0.1) does not resolve" in c.detail, c
        assert "None" not in c.detail, c
    by = {c.id: c for c in checks}
    assert by["PF-SELF-IS-SPARK1"].status == FAIL and "SPARK1 does not resolve" in (
        by["PF-SELF-IS-SPARK1"].detail
    )
    assert by["PF-DISTINCT-NODES"].status == FAIL
    assert by["PF-NO-RAY"].status == PASS  # config only: nothing to do with SPARK1


def test_unresolved_skip_leaves_fail_and_warn_alone() -> None:
    spec = next(s for s in CHECKS if s.id == "PF-PORT-FREE")
    ev = Evidence(resolved=dict(RESOLVED, SPARK1=None))
    fail = spec.verdict(FAIL, "port 8000 on SPARK1 is held")
    assert runner.unresolved_skip(spec, fail, resolve(CFG, RECIPE), ev) == fail
    ok = spec.verdict(PASS, "port 8000 free on SPARK1")
    assert runner.unresolved_skip(spec, ok, resolve(CFG, RECIPE), ev).status == SKIP
    assert runner.unresolved_skip(spec, ok, resolve(CFG, RECIPE), Evidence(resolved=RESOLVED)) == ok


def test_gather_probes_both_nodes_at_once_and_says_what_it_waits_for(monkeypatch) -> None:
    def fake_collect(n, pair):
        time.sleep(0.05 if n.rank == 0 else 0.6)
        return node(n.addr)

    monkeypatch.setattr(probe, "collect", fake_collect)
    monkeypatch.setattr(probe, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(probe, "resolve", lambda host: "10.0.0.9")
    said: list[str] = []
    stages: list[tuple[str, float]] = []
    t0 = time.monotonic()
    ev = probe.gather(
        resolve(CFG, RECIPE),
        on_stage=lambda s, e: stages.append((s, time.monotonic() - t0)),
        progress=said.append,
    )
    assert [s for s, _ in stages] == ["names", "rank0", "rank1"]
    assert stages[1][1] < 0.4  # rank 0 reported long before rank 1 answered
    assert any("rank 1 over ssh (10.0.0.2; ssh gives up after 10 s" in m for m in said), said
    assert any(m.startswith("still waiting for rank 1") for m in said), said
    assert ev.rank1.addrs == ["10.0.0.2"] and ev.resolved["SPARK2"] == "10.0.0.9"
