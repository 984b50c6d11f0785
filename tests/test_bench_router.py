"""bench/bench_router.py against two simulated pairs: it spawns the real router twice
(consistent_hash, round_robin), measures, writes its JSON, and refuses busy pairs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from bench import bench_router
from tests.support.twin import Twin, free_port, wait_http


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("bench-router")
    twins, urls = [], []
    for name in ("a", "b"):
        port = free_port()
        args = ["m", "--port", str(port), "--host", "127.0.0.1", "--twin-profile", "rehearsal"]
        twins.append(Twin(args, tmp, name, env={"VLLM_INCREMENTAL_ENCODE_CACHE": "1"}))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for u in urls:
            wait_http(u + "/health", 30)
        yield urls
    finally:
        for t in twins:
            t.stop()


def test_bench_router_measures_affinity_and_overhead(pairs: list[str], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["--pairs", ",".join(pairs), "--conversations", "4", "--turns", "3"]
    argv += ["--first-tokens", "1k", "--turn-tokens", "512", "--max-tokens", "8"]
    argv += ["--repeats", "1", "--overhead-requests", "4", "--overhead-concurrency", "1,4"]
    assert bench_router.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["simulator"] is True and doc["exit_code"] == 0
    turns = doc["multi_turn"]
    assert [t["turn"] for t in turns] == [0, 1, 2]
    for t in turns[1:]:
        # a conversation that stays on its pair finds its history in that pair's cache
        assert t["prefix_hit_rate"]["affinity"] > 0.3
        assert t["prefix_hit_rate"]["direct"] > 0.3
        assert t["ttft_ms"]["affinity"]["n"] == 4 and not any(t["errors"].values())
        assert t["router_added_ttft_ms_median"] is not None
    levels = {row["concurrency"]: row for row in doc["overhead"]}
    assert set(levels) == {1, 4}
    assert levels[4]["router"]["e2e_ms"]["n"] == 4
    assert levels[1]["router_added_e2e_ms_median"] is not None


def test_bench_router_refuses_pairs_with_foreign_traffic(pairs: list[str], tmp_path: Path) -> None:
    r = requests.post(f"{pairs[1]}/twin/foreign", json={"requests": 1, "seconds": 5}, timeout=5)
    assert r.status_code == 200
    argv = ["--pairs", ",".join(pairs), "--skip-multiturn", "--json", str(tmp_path / "x.json")]
    assert bench_router.main(argv) == 3
