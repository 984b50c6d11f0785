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


def test_attributed_report_infers_where_real_engines_name_no_pair() -> None:
    """Real vLLM sends no X-Spark-Pair: before the kill a turn was on its session's home
    (so a failure on the survivor's session is not excused as "in flight on the victim");
    after it, on the survivor, but only while the killed head stays dead."""
    home = {"s-a": "pair-a", "s-b": "pair-b"}
    turns = [
        t("s-a", 1.0, None, True),
        t("s-b", 1.0, None, True),
        t("s-b", 9.5, None, False),  # in flight on the victim: expected
        t("s-a", 9.6, None, False),  # failed on the survivor before the kill: not excusable
        t("s-b", 10.2, None, True),
        t("s-a", 10.4, None, True),
    ]

    def report(victim_answers: bool) -> Report:
        rep = Report("pair-b", home, [Turn(**vars(x)) for x in turns], 10.0, 1.5)
        rep.counted_from, rep.victim_answers, rep.survivor_finished = 10.1, victim_answers, 2
        return classify(rep)

    rep = report(victim_answers=False)
    assert rep.survivor == "pair-a"
    assert [(x.session, x.t0) for x in rep.lost_in_flight] == [("s-b", 9.5)]
    assert [(x.session, x.t0) for x in rep.unexpected] == [("s-a", 9.6)]
    assert rep.moved == {"s-b": ["pair-a"]}
    assert rep.answered_since(rep.counted_from or 0) == 2
    assert "pair-a's own vllm:request_success_total: 2 finished" in "\n".join(rep.lines())
    # a head that still answers: nothing after the kill can be attributed
    rep = report(victim_answers=True)
    assert rep.moved == {"s-a": ["?"], "s-b": ["?"]}
    rep.survivor_finished = None  # the survivor's counter unreadable: said, not a crash
    assert "pair-a's own vllm:request_success_total: ? finished" in "\n".join(rep.lines())


class _Metrics:
    """Two fake heads' /metrics on loopback, counts set by the test."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.counts = {"pair-a": 3.0, "pair-b": 7.0}
        self.servers = {}
        outer = self

        for pair in self.counts:

            class H(http.server.BaseHTTPRequestHandler):
                name = pair

                def do_GET(self) -> None:  # noqa: N802 - http.server's name
                    body = (
                        "# HELP vllm:request_success_total Count of successfully processed "
                        "requests.\n# TYPE vllm:request_success_total counter\n"
                        'vllm:request_success_total{engine="0",finished_reason="length",'
                        f'model_name="m"}} {outer.counts[self.name] - 1}\n'
                        'vllm:request_success_total{engine="0",finished_reason="stop",'
                        'model_name="m"} 1.0\n'
                    ).encode()
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *_a: object) -> None:
                    pass

            srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self.servers[pair] = srv

    def endpoints(self) -> dict[str, str]:
        return {p: f"http://127.0.0.1:{s.server_address[1]}" for p, s in self.servers.items()}

    def close(self) -> None:
        for s in self.servers.values():
            s.shutdown()
            s.server_close()


def test_counters_name_the_pair_that_finished_the_request() -> None:
    import threading

    from sim.rehearsal.whichpair import Counters

    fake = _Metrics()
    try:
        c = Counters(fake.endpoints())
        assert c.read() == {"pair-a": 3.0, "pair-b": 7.0}  # summed over finished_reason

        def on(pair: str, delay: float = 0.0) -> str:
            def bump() -> None:
                fake.counts[pair] += 1

            threading.Timer(delay, bump).start() if delay else bump()
            return "reply"

        assert c.served(lambda: on("pair-b")) == ("reply", "pair-b")
        # counted just after the client has its answer (vLLM records stats after queueing)
        assert c.served(lambda: on("pair-a", 0.3)) == ("reply", "pair-a")
        # nobody finished it, or both grew: not attributable
        assert c.served(lambda: "x", settle_s=0.3) == ("x", None)
        assert c.served(lambda: (on("pair-a"), on("pair-b"))[0]) == ("reply", None)
        fake.servers["pair-b"].shutdown()
        fake.servers["pair-b"].server_close()
        assert c.read()["pair-b"] is None  # a dead head reads as None, not 0
    finally:
        fake.servers["pair-a"].shutdown()


def test_stream_readers_keep_a_chunk_whole_across_unicode_line_separators() -> None:
    """Real vLLM writes a chunk's text unescaped; the tiny random model's gibberish holds
    U+2028 / U+0085, where str.splitlines (requests' decode_unicode=True) cut the JSON."""
    import http.server
    import threading

    from sim.rehearsal import chat, failover

    text = "a\u2028b\x85c\u2029d"
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
    body = (
        f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n'
    ).encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        res = chat.stream_chat(url, "hi", model="m")
        assert res.content == text and res.usage == {"prompt_tokens": 3}
        turn = failover.one_turn(url, "m", "s", [], 0, 8)
        assert turn.ok and turn.text == text, turn.error
    finally:
        srv.shutdown()
        srv.server_close()
