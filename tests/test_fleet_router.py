"""Two simulated pairs behind the real vLLM router (PyPI vllm-router, the pinned version), on
loopback: session affinity, the twin's identity header, the metric names the fleet's
Grafana dashboard uses (vLLM 0.33's, the router's, and what the twin exports), and, last (it
kills pair-b), a failover judged turn by turn on the twins' own headers.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import vllm_router_rs
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_router_runs import default_router_bin
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import REPO, Tuning
from tests.support.twin import Twin, free_port, wait_http

DASHBOARD = REPO / "monitoring" / "grafana" / "dsv4-fleet.json"
VLLM_NAME = re.compile(r"vllm:[a-z_]+")
ROUTER_NAME = re.compile(r"vllm_router_[a-z_]+")
CLS_NAME = re.compile(r"_(counter|gauge|histogram)_cls\(\s*name=\"(vllm:[a-z_]+)\"")
FAST = Tuning(
    health_check_interval_s=1,
    health_check_timeout_s=2,
    health_failure_threshold=2,
    health_success_threshold=1,
    worker_startup_timeout_s=30,
)


@dataclass
class Setup:
    pairs: dict[str, str]  # pair id -> endpoint
    router: str
    router_metrics: str
    twins: dict[str, Twin]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("fleet-router")
    twins, pairs = [], {}
    for pid in ("pair-a", "pair-b"):
        port = free_port()
        args = ["m", "--port", str(port), "--host", "127.0.0.1", "--twin-profile", "rehearsal"]
        twins.append(Twin([*args, "--twin-pair-id", pid], tmp, pid))
        pairs[pid] = f"http://127.0.0.1:{port}"
    port, mport = free_port(), free_port()
    argv = [default_router_bin()] + rt.router_args(
        list(pairs.values()),
        policy="consistent_hash",
        bind="127.0.0.1",
        port=port,
        metrics_bind="127.0.0.1",
        metrics_port=mport,
        tuning=FAST,
    )
    log = open(tmp / "router.log", "w")  # noqa: SIM115 - closed below
    router = None
    try:
        for url in pairs.values():
            wait_http(url + "/health", 30)
        router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        v = rt.wait_sees(url, list(pairs.values()), 30, poll_s=0.2)
        assert v.ready and all(v.workers.values()), (v, (tmp / "router.log").read_text())
        metrics = f"http://127.0.0.1:{mport}/metrics"
        yield Setup(pairs, url, metrics, dict(zip(pairs, twins, strict=True)))
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        log.close()
        for t in twins:
            t.stop()


def turn(url: str, history: list[dict], sid: str | None, n: int) -> tuple[str | None, str]:
    msgs = [*history, {"role": "user", "content": f"Conversation turn {n}: say more."}]
    headers = {"X-Session-ID": sid} if sid else {}
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={"model": "m", "messages": msgs, "max_tokens": 6},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.headers.get("X-Spark-Pair"), r.json()["choices"][0]["message"]["content"]


def conversation(url: str, sid: str | None, turns: int, tag: str) -> list[str | None]:
    history: list[dict] = []
    seen = []
    for n in range(turns):
        pair, text = turn(url, history, sid, n)
        history += [
            {"role": "user", "content": f"{tag} turn {n}"},
            {"role": "assistant", "content": text},
        ]
        seen.append(pair)
    return seen


def test_each_pair_names_itself(setup: Setup) -> None:
    for pid, url in setup.pairs.items():
        pair, _ = turn(url, [], None, 0)
        assert pair == pid


def test_session_id_keeps_a_conversation_on_one_pair(setup: Setup) -> None:
    # 20 sessions: the ring hashes over the twins' random ports, and all of n sessions land on
    # one pair in ~2 x 2^-n of runs (10 would fail one run in 500)
    homes = {}
    for i in range(20):
        seen = conversation(setup.router, f"conv-{i}", 3, f"c{i}")
        assert len(set(seen)) == 1, f"conv-{i} moved: {seen}"
        homes[f"conv-{i}"] = seen[0]
    assert set(homes.values()) == set(setup.pairs), f"one pair got every session: {homes}"


def test_without_a_session_id_every_request_lands_on_one_pair(setup: Setup) -> None:
    """vllm-router 0.1.17 hashes chat requests without a session header on an empty routing
    text (its log says `Extracted hash key: request:`), so all of them go to one pair: no
    spreading at all. Clients must send X-Session-ID (docs/fleet.md); this test notices
    when an upgrade changes that."""
    seen = {p for i in range(6) for p in conversation(setup.router, None, 2, f"n{i}")}
    assert len(seen) == 1, seen


def _series(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def dashboard_names() -> tuple[set[str], set[str]]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    text = "\n".join(exprs)
    return set(VLLM_NAME.findall(text)), set(ROUTER_NAME.findall(text))


def vllm_metric_kinds() -> dict[str, str]:
    """vLLM 0.33's metric names and kinds, read from its installed source."""
    import vllm

    root = Path(vllm.__file__).parent
    kinds: dict[str, str] = {}
    for rel in ("v1/metrics/loggers.py", "v1/spec_decode/metrics.py"):
        src = (root / rel).read_text()
        for kind, name in re.findall(CLS_NAME, src):
            kinds[name] = kind
        if rel.startswith("v1/spec_decode"):
            for name in re.findall(r"\(\s*\"(vllm:spec_decode_[a-z_]+)\",", src):
                kinds.setdefault(name, "counter")
    return kinds


def exposed(name: str, kind: str) -> set[str]:
    """Sample names Prometheus sees for a metric (prometheus_client's suffixes)."""
    return {
        "counter": {name + "_total"},
        "gauge": {name},
        "histogram": {name + "_bucket", name + "_sum", name + "_count"},
    }[kind]


@pytest.mark.needs_vllm
def test_dashboard_vllm_metrics_exist_in_vllm_0_33() -> None:
    kinds = vllm_metric_kinds()
    assert "vllm:time_to_first_token_seconds" in kinds and len(kinds) > 30
    valid = {s for n, k in kinds.items() for s in exposed(n, k)}
    used, _ = dashboard_names()
    assert used, "the dashboard uses vLLM metrics"
    assert used <= valid, f"not vLLM 0.33 metric series: {sorted(used - valid)}"


def test_dashboard_router_metrics_exist_in_the_pinned_router(setup: Setup) -> None:
    """Every router metric the dashboard plots is in the installed router (its compiled
    source), and the ones a running router exports at once appear on its /metrics."""
    binary = Path(vllm_router_rs.__file__).read_bytes().decode("latin-1")
    _, used = dashboard_names()
    # names sit in the binary's string table, sometimes run together: end = non-name or vllm_
    absent = {n for n in used if not re.search(re.escape(n) + r"(?=vllm_|[^a-z_])", binary)}
    assert used and not absent, f"not in vllm-router 0.1.17: {sorted(absent)}"
    conversation(setup.router, "metrics-probe", 2, "m")
    text = requests.get(setup.router_metrics, timeout=5).text
    live = _series(text)
    core = {
        "vllm_router_worker_health",
        "vllm_router_processed_requests_total",
        "vllm_router_cb_state",
        "vllm_router_active_workers",
    }
    assert core <= used, "the dashboard shows worker health and routing"
    assert core <= live, f"router /metrics lacks {sorted(core - live)}"
    workers = {
        s.labels.get("worker")
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "vllm_router_worker_health"
    }
    assert workers == set(setup.pairs.values()), "dashboard legends use the worker label"


def test_the_twin_exports_every_vllm_metric_the_dashboard_uses(setup: Setup) -> None:
    url = setup.pairs["pair-a"]
    turn(url, [], None, 0)
    text = requests.get(f"{url}/metrics", timeout=5).text
    live = _series(text)
    used, _ = dashboard_names()
    missing = {n for n in used if n not in live}
    assert not missing, f"the twin does not export {sorted(missing)}"


def test_twin_takes_the_clients_request_id(setup: Setup) -> None:
    """As vLLM does (vllm/entrypoints/serve/engine/serving.py `_base_request_id`): the
    request id becomes chatcmpl-<X-Request-Id>; bench/bench_router.py finds records by it."""
    url = setup.pairs["pair-b"]
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "id?"}], "max_tokens": 2},
        headers={"X-Request-Id": "fleet-test-7"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-fleet-test-7"
    ids = {rec["id"] for rec in requests.get(f"{url}/twin/requests", timeout=5).json()}
    assert "chatcmpl-fleet-test-7" in ids


def sessions_on_both_pairs(router: str, each: int = 3) -> list[str]:
    """Session names the router's ring puts on pair-a and on pair-b, ``each`` apiece (one
    short turn each, read off X-Spark-Pair). The ring hashes the session header over the
    workers' URLs, whose ports are random here: six fixed names all landed on pair-a in a
    clean-clone CI run (2026-12-05), ~3% of runs with two pairs."""
    from sim.rehearsal import failover

    found: dict[str, list[str]] = {"pair-a": [], "pair-b": []}
    for i in range(64):
        turn = failover.one_turn(router, "m", f"conv-{i}", [], 0, 4)
        assert turn.ok and turn.pair in found, (turn.pair, turn.error)
        if len(found[turn.pair]) < each:
            found[turn.pair].append(f"conv-{i}")
        if all(len(names) == each for names in found.values()):
            return found["pair-a"] + found["pair-b"]
    raise AssertionError(f"64 sessions did not put {each} on each pair: {found}")


def test_failover_turn_by_turn_on_the_twins_headers(setup: Setup) -> None:
    """Last in the file: it kills pair-b. What the real-engine fleet walk
    (tests/test_fleet_e2e.py) can only infer (real vLLM names no pair: it attributes by
    session home and the survivor's counter), checked here on every single turn's
    X-Spark-Pair: each lost request was on pair-b, every later turn of a moved conversation
    came from pair-a, and pair-a's conversations never left it."""
    from sim.rehearsal import failover

    victim = setup.twins["pair-b"]
    rep = failover.run(
        setup.router,
        "m",
        sessions_on_both_pairs(setup.router),
        "pair-b",
        setup.pairs["pair-b"],
        victim.proc.kill,
        mark_down_limit_s=10,
        max_tokens=16,
    )
    assert rep.counted_from is None  # judged on the headers alone
    assert rep.marked_down_s is not None
    assert rep.unexpected == [], [(x.session, x.n, x.pair, x.error) for x in rep.unexpected]
    assert all(x.pair in ("pair-b", None) for x in rep.lost_in_flight)
    after = [x for x in rep.turns if x.ok and x.t0 > rep.kill_at]
    assert after and all(x.pair == "pair-a" for x in after), [(x.session, x.pair) for x in after]
    for s, home in rep.home.items():
        if home == "pair-a":
            assert s not in rep.moved
        else:
            assert rep.moved.get(s) == ["pair-a"]
