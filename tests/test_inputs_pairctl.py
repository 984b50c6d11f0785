"""The launcher and the fleet answer bad inputs right: a key problem is never a
reason to restart, `status` shows only figures it can prove are this pair's, bad files are
refused before any probe, and nothing ends in a traceback.

Each case failed on the code before (a traceback, a restart, a wrong verdict or exit code,
a misleading hint). No network namespaces: fakes and 127.0.0.1 only.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from pairctl import contracts
from pairctl.cli import main as cli
from pairctl.fleet import cli as fleet_cli
from pairctl.fleet import ops as fleet_ops
from pairctl.fleet import render as fleet_render
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import load_inventory
from pairctl.fleet.pairs import PairView
from pairctl.lifecycle.steps import Health, probe_health
from pairctl.nodes.docker import Container
from pairctl.nodes.ssh import Result
from pairctl.pair.config import ConfigError, load_env_file
from pairctl.pair.plan import LABEL_PAIR
from pairctl.status import pair as st
from pairctl.status import watch
from tests.support.fleet import inventory_data, write_inventory

REPO = Path(__file__).resolve().parents[1]


def example_env(tmp: Path, **changes: str) -> Path:
    lines = []
    for line in (REPO / ".env.example").read_text().splitlines():
        key = line.split("=", 1)[0]
        lines.append(f"{key}={changes[key]}" if key in changes else line)
    path = tmp / "pair.env"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- env files ---------------------------------------------------------------------------------
def test_an_env_file_that_is_not_utf8_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.env"
    path.write_bytes(b"PAIR_ID=pair-a\n# caf\xe9\nSPARK1=10.0.0.1\n")
    with pytest.raises(ConfigError) as e:
        load_env_file(path)
    assert f"{path}:2: not UTF-8 text (byte 0xe9)" in str(e.value)


def test_an_env_file_that_is_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_env_file(tmp_path)
    assert "is a directory" in str(e.value) and "not found" not in str(e.value)


def test_spark1_equal_to_spark2_is_refused(tmp_path: Path, capsys) -> None:
    path = example_env(tmp_path, SPARK1="10.0.0.7", SPARK2="10.0.0.7")
    assert cli.main(["plan", "--env-file", str(path)]) == contracts.EXIT_USAGE
    assert "SPARK1 and SPARK2 are both 10.0.0.7" in capsys.readouterr().err


def test_a_fleet_inventory_naming_a_missing_env_file_does_not_suggest_env_file(
    tmp_path: Path,
) -> None:
    data = inventory_data(tmp_path)
    data["pairs"][1]["env_file"] = str(tmp_path / "gone.env")
    with pytest.raises(ConfigError) as e:
        load_inventory(write_inventory(tmp_path, data))
    assert "--env-file" not in str(e.value)
    assert "pairs[1].env_file" in str(e.value)


# ---- paths checked before any probe ------------------------------------------------------------
@pytest.fixture
def no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(*_a, **_k):
        raise AssertionError("a probe ran before the bad path was refused")

    # every preflight, pair or group, whole or identity only (sync-overlays), runs here
    monkeypatch.setattr(cli.pfgroup.runner, "run", probe)


def test_preflight_json_under_proc_is_refused_before_any_probe(
    tmp_path: Path, capsys, no_probe: None
) -> None:
    env = example_env(tmp_path)
    rc = cli.main(["preflight", "--env-file", str(env), "--json", "/proc/x"])
    assert rc == contracts.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--json /proc/x is not writable" in err and "Traceback" not in err


def test_sync_overlays_src_that_does_not_exist_is_refused_before_any_probe(
    tmp_path: Path, capsys, no_probe: None
) -> None:
    env = example_env(tmp_path)
    rc = cli.main(["sync-overlays", "--env-file", str(env), "--src", "/nonexistent"])
    assert rc == contracts.EXIT_USAGE
    assert "--src /nonexistent does not exist" in capsys.readouterr().err


def test_fleet_prometheus_output_in_a_missing_directory_is_a_usage_error(
    tmp_path: Path, capsys
) -> None:
    inv = write_inventory(tmp_path, inventory_data(tmp_path))
    with pytest.raises(SystemExit) as e:
        fleet_cli.main(["prometheus", "--inventory", str(inv), "--output", "/nonexistent/p.yml"])
    assert e.value.code == contracts.EXIT_USAGE
    err = capsys.readouterr().err
    assert "directory /nonexistent does not exist" in err and "Traceback" not in err


# ---- fleet status and up -------------------------------------------------------------------------
def _fleet_status(tmp: Path, healthy: tuple[bool, bool], router_ready: bool):
    fleet = load_inventory(write_inventory(tmp, inventory_data(tmp)))
    a, b = fleet.pairs
    pairs = {
        p.pair_id: PairView(p.pair_id, p.endpoint, ok, "ok" if ok else "connection failed")
        for p, ok in zip((a, b), healthy, strict=True)
    }
    view = rt.RouterView(router_ready, router_ready, "ready" if router_ready else "ConnectionError")
    return fleet, fleet_ops.FleetStatus(pairs, [], "", view)


@pytest.mark.parametrize(
    ("healthy", "router", "code"),
    [
        ((True, True), True, 0),
        ((True, False), True, 7),
        ((True, True), False, 7),
        ((False, False), False, 8),
    ],
)
def test_fleet_status_exit_codes_are_like_a_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, healthy, router, code
) -> None:
    fleet, status = _fleet_status(tmp_path, healthy, router)
    monkeypatch.setattr(fleet_ops, "status", lambda _f: status)
    inv = tmp_path / "fleet.yaml"
    assert fleet_cli.main(["status", "--inventory", str(inv)]) == code
    assert status.to_json(fleet)["exit_code"] == code
    if code == 8:
        assert "DOWN" in capsys.readouterr().out


def test_fleet_up_refused_at_once_prints_no_empty_summary(tmp_path: Path) -> None:
    fleet = load_inventory(write_inventory(tmp_path, inventory_data(tmp_path)))
    res = fleet_ops.UpResult(code=fleet_ops.EXIT_PREFLIGHT)
    assert fleet_render.up_summary(fleet, res) == ""


# ---- a 401 is a key problem ----------------------------------------------------------------------
class _KeyServer(BaseHTTPRequestHandler):
    def _reply(self) -> None:
        code = 200 if self.path == "/health" else 401
        body = b"" if code == 200 else b'{"error": "Unauthorized"}'
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply  # noqa: N815 - http.server's names

    def log_message(self, *_a) -> None:
        pass


@pytest.fixture
def keyed() -> str:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _KeyServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_health_does_not_say_the_key_differs_when_none_is_set(keyed: str) -> None:
    none = probe_health(keyed)
    assert none.key_rejected and "differs" not in none.detail
    assert "VLLM_API_KEY is not set" in none.detail
    wrong = probe_health(keyed, api_key="wrong-key-123")
    assert wrong.key_rejected and "rejected VLLM_API_KEY" in wrong.detail
    assert "wrong-key-123" not in wrong.detail


def test_watch_stops_on_a_rejected_key_and_never_restarts(keyed: str) -> None:
    restarts: list[int] = []
    lines: list[str] = []

    def restart() -> int:
        restarts.append(1)
        raise AssertionError("the pair was restarted for a key problem")

    dog = watch.Watchdog(
        watch.WatchConfig(interval_s=0.01, failures=1),
        probe=lambda: watch.probe_token(keyed, 5.0, "wrong-key-123"),
        restart=restart,
        log=lines.append,
        sleep=lambda _s: None,
    )
    assert watch.serve(dog, "test") == contracts.EXIT_KEY
    assert restarts == []
    assert "not restarted" in lines[-1] and "VLLM_API_KEY" in lines[-1]
    assert not any("wrong-key-123" in ln for ln in lines)
    assert contracts.meaning(contracts.EXIT_KEY).startswith("API key rejected")


# ---- status proves the endpoint is this pair's -------------------------------------------------
def _rank(r: int, state: str, reachable: bool = True) -> st.RankStatus:
    return st.RankStatus(
        r,
        "head" if r == 0 else "worker",
        f"10.0.0.{r + 1}",
        reachable,
        "" if reachable else "ssh: no route",
        f"dsv4-pair-b-rank{r}",
        state if reachable else st.UNKNOWN,
        None,
        None,
        [],
        None,
    )


@pytest.fixture
def fake_pair(monkeypatch: pytest.MonkeyPatch):
    """collect() with every effect replaced; returns a function that runs one reading."""

    def run(
        health: Health,
        ranks: list[st.RankStatus],
        on_head: list[Container],
        key: str = "",
        scrape=None,
    ):
        monkeypatch.setattr(st, "probe_health", lambda base, api_key="": health)
        monkeypatch.setattr(st, "rank_status", lambda n, pid, now: ranks[n.rank])
        monkeypatch.setattr(st, "labelled_containers", lambda node: (on_head, Result(0, "", "")))
        monkeypatch.setattr(st.memory, "sample", lambda node_list: [])  # nodes' memory: not asked
        monkeypatch.setattr(st, "status_extras", lambda *a, **k: {})  # no sentinel baseline
        monkeypatch.setattr(st, "engine_generates", lambda *a: "")  # no token probe

        def no_scrape(*_a, **_k):
            raise AssertionError("the figures of an endpoint not proven ours were read")

        monkeypatch.setattr(st, "scrape", scrape or no_scrape)
        pair = SimpleNamespace(
            endpoint="http://10.0.0.1:8000",
            api_key=key,
            pair_id="pair-b",
            nodes=(SimpleNamespace(rank=0), SimpleNamespace(rank=1)),
            plan_hash="p",
            stack=SimpleNamespace(boot_identity=None),  # the fork: no per-boot identity
        )
        return st.collect(pair, None, 1.0)[0]

    return run


def test_the_seed_incident_another_pairs_endpoint_is_not_ours(fake_pair) -> None:
    """Pair B's env file with SPARK1 = pair A's head: no pair-B container there, yet pair A's
    endpoint answers. Before: "degraded", exit 7, with pair A's model and figures as B's; now
    "foreign" (pairctl/status/ownership.py: the server that answered is not ours)."""
    answered = Health(True, ["dsv4"], False, "ok", True, False, None)
    a_head = Container("c1", "dsv4-pair-a-rank0", "running", {LABEL_PAIR: "pair-a"})
    status = fake_pair(answered, [_rank(0, st.MISSING), _rank(1, st.MISSING)], [a_head])
    assert status.verdict == st.FOREIGN and status.exit_code == contracts.EXIT_FOREIGN
    assert status.serving is None and status.endpoint.models == []
    assert status.endpoint.ours == st.NOT_OURS
    assert "may be pair pair-a's" in status.endpoint.detail
    assert "dsv4-pair-a-rank0" in status.endpoint.detail


def test_an_unreachable_head_leaves_the_endpoint_unproven(fake_pair) -> None:
    answered = Health(True, ["dsv4"], False, "ok", True, False, None)
    status = fake_pair(answered, [_rank(0, "", reachable=False), _rank(1, "running")], [])
    assert status.endpoint.ours == st.UNPROVEN and status.serving is None
    assert status.verdict == st.DEGRADED


def test_a_401_from_our_own_endpoint_is_unauthorized_not_down(fake_pair) -> None:
    rejected = Health(False, [], False, "/v1/models HTTP 401: ...", True, True, None)
    status = fake_pair(rejected, [_rank(0, "running"), _rank(1, "running")], [], key="k")
    assert status.verdict == st.UNAUTHORIZED
    assert status.exit_code == contracts.EXIT_KEY == 9


def test_our_endpoint_keeps_its_figures(fake_pair) -> None:
    ok = Health(True, ["dsv4"], False, "ok", True, False, None)
    scrapes: list[str] = []

    def scrape(base: str, **_k):
        scrapes.append(base)
        return None, "no metrics here"

    status = fake_pair(ok, [_rank(0, "running"), _rank(1, "running")], [], scrape=scrape)
    assert status.verdict == st.HEALTHY and status.endpoint.ours == st.OURS
    assert status.endpoint.models == ["dsv4"] and scrapes
