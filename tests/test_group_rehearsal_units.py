"""The group rehearsal's judgements (sim/rehearsal/groupsteps.py) on status documents made
by status's own verdict code, and its env file for four hosts; no root, no engine."""

from __future__ import annotations

import subprocess
from dataclasses import asdict
from pathlib import Path

from pairctl.status.pair import EXIT_CODES, EndpointStatus, RankStatus, verdict
from sim.rehearsal import groupsteps, hosts, pairenv


def rank(r: int, state: str = "running") -> RankStatus:
    running = state == "running"
    return RankStatus(
        r,
        "head" if r == 0 else "worker",
        f"10.213.9.{r + 1}",
        True,
        "",
        f"dsv4-rehearsal-rank{r}",
        state,
        "2026-12-02T14:00:00Z" if running else None,
        12.0 if running else None,
        [],
        "abc",
    )


def doc_of(ranks: list[RankStatus], healthy: bool = True) -> dict:
    ep = EndpointStatus("http://x/v1", healthy, "ok", ["m"], False, True, ours="yes")
    name, reasons = verdict(ranks, ep)
    memory = [
        {"rank": r.rank, "reachable": True, "available_kib": 9 << 20, "band": "ok"} for r in ranks
    ]
    return {
        "verdict": name,
        "exit_code": EXIT_CODES[name],
        "reasons": reasons,
        "ranks": [asdict(r) for r in ranks],
        "memory": memory,
        "serving": {"decode_tok_s": 1.0},
    }


def test_a_dead_rank2_is_named_by_statuss_own_reasons() -> None:
    doc = doc_of([rank(0), rank(1), rank(2, "exited"), rank(3)])
    assert doc["verdict"] == "degraded"
    assert groupsteps.dead_rank_named(doc, 2) == []
    # the wrong rank, or a group status still calls healthy, is caught
    assert groupsteps.dead_rank_named(doc, 3)
    healthy = doc_of([rank(r) for r in range(4)])
    assert groupsteps.dead_rank_named(healthy, 2)


def test_every_rank_live_wants_all_four_ranks_and_their_memory() -> None:
    four = doc_of([rank(r) for r in range(4)])
    assert groupsteps.every_rank_live(four, 4) == []
    # a status that reads only the pair's two ranks (a launcher that knows only rank 1)
    pair_only = doc_of([rank(0), rank(1)])
    assert any("not 0..3" in w for w in groupsteps.every_rank_live(pair_only, 4))
    no_mem = {**four, "memory": four["memory"][:3]}
    assert any("rank 3: no memory" in w for w in groupsteps.every_rank_live(no_mem, 4))
    assert "rank 3 (10.213.9.4): dsv4-rehearsal-rank3 running" in groupsteps.summary(four)


def test_four_hosts_get_one_group_env_and_two_stay_a_pair(tmp_path: Path) -> None:
    def pair_of(n: int) -> hosts.Pair:
        hs = [
            hosts.Host(f"p-h{i}", i - 1, f"10.1.1.{i}", "p-if0", tmp_path, f"10.2.1.{i}", "p-fab0")
            for i in range(1, n + 1)
        ]
        return hosts.Pair("p", tmp_path, "", "", "", hs)

    four = pairenv.env_values(pair_of(4), pairenv.layout(pair_of(4), "cpu"), engine="cpu")
    assert [four[f"SPARK{i}"] for i in range(1, 5)] == [f"10.1.1.{i}" for i in range(1, 5)]
    assert [four[f"FABRIC{i}"] for i in range(1, 5)] == [f"10.2.1.{i}" for i in range(1, 5)]
    assert four["CABLING"] == "switched"
    two = pairenv.env_values(pair_of(2), pairenv.layout(pair_of(2), "cpu"), engine="cpu")
    assert not {"SPARK3", "SPARK4", "FABRIC3", "FABRIC4", "CABLING"} & set(two)
    assert {k: v for k, v in four.items() if k in two} == two


def test_memwatch_sums_the_hosts_processes_and_keeps_the_worst_moment() -> None:
    """A stand-in host whose netns holds this process: PSS and RSS are this process's, the
    peak keeps the largest sums and the lowest MemAvailable seen."""
    import os

    from sim.rehearsal import memwatch

    class OneProcess:
        def pids(self) -> list[int]:
            return [os.getpid()]

        def sshd_pid(self) -> None:
            return None

    watch = memwatch.MemWatch([OneProcess()])  # type: ignore[list-item]
    watch.sample()
    first = watch.peak.hosts_pss_max_kib
    ballast = bytearray(64 << 20)  # 64 MiB, touched: resident
    ballast[::4096] = b"x" * len(ballast[::4096])
    watch.sample()
    del ballast
    watch.sample()
    peak = watch.peak
    assert peak.samples == 3
    assert peak.hosts_pss_max_kib - first >= 60 << 10
    assert peak.hosts_rss_max_kib >= peak.hosts_pss_max_kib
    assert peak.available_min_kib <= peak.available_before_kib
    assert "GiB (PSS;" in peak.line()


class _RecordingHost:
    name = "h1"

    def __init__(self) -> None:
        self.argv: list[str] = []

    def docker(self, *argv: str):
        self.argv = list(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    def env(self) -> list[str]:
        """The image ENV the last `docker load-fake` gave."""
        return [self.argv[i + 1] for i, a in enumerate(self.argv) if a == "--env"]


def test_the_simulator_image_turns_off_cuda_jit_builds_and_other_images_keep_their_env() -> None:
    """The simulator image is CPU-only: its ENV stops humming-kernels' background CUDA builds
    at `import vllm` (the image probe, the argv check); the engine image keeps what it is given."""
    host = _RecordingHost()
    pairenv.load_image(host)
    assert host.env() == [f"PATH={pairenv.SIM_IMAGE_PATH}", "HUMMING_DISABLE_PARALLEL_BUILD=1"]
    pairenv.load_image(host, pairenv.ENGINE_IMAGE_ID, pairenv.ENGINE_IMAGE, env=("A=1",))
    assert host.env() == ["A=1"]
