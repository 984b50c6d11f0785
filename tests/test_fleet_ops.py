"""Fleet orchestration without machines: up/down decisions, the router's command line, ssh.

The side effects (pair status, pair launchers, the router container) are replaced through
`ops.Deps`; what must hold is the control flow: pairs come up side by side, one failing
pair stops no other, healthy pairs are left alone, the summary and the exit code say which
failed, and nothing starts when the router host is not ready.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest
from vllm_router.launch_router import parse_router_args

from pairctl.fleet import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PAIRS,
    EXIT_PREFLIGHT,
    EXIT_ROUTER,
    monitoring,
    ops,
    render,
)
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import Fleet, PairEntry
from pairctl.fleet.pairs import PairView, env_file_matches, pair_argv
from pairctl.fleet.remote import PID_TAG, Machine, is_local_address
from pairctl.lock import LockHeld
from pairctl.nodes.ssh import Result
from sim.rehearsal.docker_args import require_contract, run_args
from tests.support.fleet import SECRET, fleet


@pytest.fixture()
def f(tmp_path: Path) -> Fleet:
    return fleet(tmp_path)


def view(p: PairEntry, healthy: bool) -> PairView:
    return PairView(p.pair_id, p.endpoint, healthy, "ok" if healthy else "ConnectionError")


class Fakes:
    """Pair health that a launcher `up` changes; launchers that record and can fail."""

    def __init__(self, f: Fleet, healthy: set[str], fail: dict[str, int] | None = None) -> None:
        self.healthy, self.fail = set(healthy), fail or {}
        self.calls: list[tuple[str, str]] = []
        self.router_calls: list[list[str]] = []
        self.lock = threading.Lock()
        self.concurrent = 0
        self.max_concurrent = 0
        self.preflight_error: str | None = None
        self.router_error = ""

    def status(self, p: PairEntry) -> PairView:
        return view(p, p.pair_id in self.healthy)

    def launcher(self, f: Fleet, p: PairEntry, cmd: str, extra: list[str], out) -> tuple[int, str]:
        with self.lock:
            self.calls.append((p.pair_id, cmd))
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        time.sleep(0.2)  # long enough that a sequential fleet would never overlap two
        with self.lock:
            self.concurrent -= 1
        rc = self.fail.get(p.pair_id, 0)
        if rc == 0 and cmd == "up":
            self.healthy.add(p.pair_id)
        return rc, ""

    def router_up(self, f: Fleet, healthy: list[str], out) -> ops.RouterOutcome:
        self.router_calls.append(healthy)
        v = rt.RouterView(True, not self.router_error, "ready", {u: True for u in healthy})
        return ops.RouterOutcome("started", self.router_error, v)

    def deps(self) -> ops.Deps:
        return ops.Deps(
            status=self.status,
            env_check=lambda f, p: None,
            launcher=self.launcher,
            router_preflight=lambda f: self.preflight_error,
            router_up=self.router_up,
            router_remove=lambda f: (["dsv4-fleet-test-router"], None),
        )


def run_up(f: Fleet, fk: Fakes) -> tuple[ops.UpResult, str]:
    buf = io.StringIO()
    res = ops.up(f, 900, ops.Out(buf), fk.deps())
    return res, buf.getvalue() + render.up_summary(f, res)


def test_up_brings_up_unhealthy_pairs_in_parallel_and_starts_the_router(f: Fleet) -> None:
    fk = Fakes(f, healthy=set())
    res, text = run_up(f, fk)
    assert res.code == EXIT_OK
    assert sorted(fk.calls) == [("pair-a", "up"), ("pair-b", "up")]
    assert fk.max_concurrent == 2, "pairs must come up side by side, not one after the other"
    assert fk.router_calls == [[p.endpoint for p in f.pairs]]
    assert "router: started, ready, 2/2" in text and "not serving" not in text


def test_up_leaves_healthy_pairs_alone(f: Fleet) -> None:
    fk = Fakes(f, healthy={"pair-a"})
    res, text = run_up(f, fk)
    assert res.code == EXIT_OK and fk.calls == [("pair-b", "up")]
    assert "already healthy" in text


def test_one_failing_pair_stops_no_other_and_is_named(f: Fleet) -> None:
    fk = Fakes(f, healthy=set(), fail={"pair-a": 4})
    res, text = run_up(f, fk)
    assert res.code == EXIT_PAIRS
    assert sorted(fk.calls) == [("pair-a", "up"), ("pair-b", "up")]
    assert fk.router_calls == [[f.pairs[1].endpoint]], "router comes up with the healthy pair"
    assert "FAILED: launcher exit 4 (boot failure" in text
    assert "not serving: pair-a" in text


def test_no_healthy_pair_means_no_router(f: Fleet) -> None:
    fk = Fakes(f, healthy=set(), fail={"pair-a": 3, "pair-b": 5})
    res, text = run_up(f, fk)
    assert res.code == EXIT_PAIRS and fk.router_calls == []
    assert "router was not started" in text and "health timeout" in text


def test_router_host_not_ready_starts_nothing(f: Fleet) -> None:
    fk = Fakes(f, healthy=set())
    fk.preflight_error = "router image dsv4-vllm-router:0.1.17 is not on router host"
    res, text = run_up(f, fk)
    assert res.code == EXIT_PREFLIGHT and fk.calls == [] and fk.router_calls == []
    assert "nothing was started or removed" in text


def test_router_that_does_not_get_ready_is_exit_5(f: Fleet) -> None:
    fk = Fakes(f, healthy={"pair-a", "pair-b"})
    fk.router_error = "router at http://10.9.0.50:8080 not ready: ConnectionError"
    res, text = run_up(f, fk)
    assert res.code == EXIT_ROUTER and "not ready" in text


def test_env_file_that_differs_on_the_head_keeps_that_pair_down(f: Fleet) -> None:
    fk = Fakes(f, healthy=set())
    deps = fk.deps()
    deps.env_check = lambda fl, p: "differs" if p.pair_id == "pair-b" else None
    buf = io.StringIO()
    res = ops.up(f, 900, ops.Out(buf), deps)
    assert fk.calls == [("pair-a", "up")] and res.code == EXIT_PAIRS
    assert "FAILED: differs" in render.up_summary(f, res)


def test_down_removes_router_then_every_pair(f: Fleet) -> None:
    fk = Fakes(f, healthy={"pair-a", "pair-b"})
    buf = io.StringIO()
    res = ops.down(f, False, ops.Out(buf), fk.deps())
    assert res.code == EXIT_OK and res.router_removed == ["dsv4-fleet-test-router"]
    assert sorted(fk.calls) == [("pair-a", "down"), ("pair-b", "down")]
    fk.calls.clear()
    res = ops.down(f, True, ops.Out(buf), fk.deps())
    assert fk.calls == [], "--router-only leaves the pairs serving"
    fk.fail = {"pair-b": 1}
    res = ops.down(f, False, ops.Out(buf), fk.deps())
    assert res.code == EXIT_ERROR and "FAILED (exit 1)" in render.down_summary(f, res)


def test_fleet_lock_is_exclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with ops.fleet_lock("test"):
        with pytest.raises(LockHeld, match="another fleet up/down"):
            with ops.fleet_lock("test"):
                pass
    with ops.fleet_lock("test"):
        pass


def test_router_command_line_is_what_vllm_router_0_1_17_parses(f: Fleet) -> None:
    """The real router's own parser reads our flags back as the values we meant."""
    args = parse_router_args(rt.fleet_router_args(f))
    args._validate_router_args()
    t = f.router.tuning
    assert args.worker_urls == [p.endpoint for p in f.pairs]
    assert args.policy == "consistent_hash"
    assert (args.host, args.port) == ("0.0.0.0", 8080)
    assert (args.prometheus_host, args.prometheus_port) == ("0.0.0.0", 29000)
    assert args.health_check_interval_secs == t.health_check_interval_s == 10
    assert args.health_failure_threshold == 3 and args.health_success_threshold == 2
    # the pair launcher's backstop: a ~10 min cold boot, the phases end a stalled one sooner
    assert args.worker_startup_timeout_secs == 2700
    assert args.request_timeout_secs == 7200  # longer than a 1,029 s TTFT plus decode
    assert args.retry_max_retries == 4 and args.cb_failure_threshold == 2


def test_router_docker_line_is_labelled_and_in_the_contract(f: Fleet, tmp_path: Path) -> None:
    argv = rt.docker_run_argv(f)
    run = run_args(argv[1:])
    require_contract(run)  # -d, --network host: what the rehearsal runtime and docs promise
    assert run.label_dict() == {
        "dsv4.fleet": "test",
        "dsv4.role": "router",
        "dsv4.plan": rt.plan_hash(f),
    }
    assert run.name == "dsv4-fleet-test-router" and run.image == "dsv4-vllm-router:0.1.17"
    assert run.cmd[:2] == ["--host", "0.0.0.0"], "the image's entrypoint is vllm-router"
    other = tmp_path / "other"
    other.mkdir()
    assert rt.plan_hash(fleet(other)) == rt.plan_hash(f), "same settings, same plan"
    h = fleet(tmp_path, health_check_interval_s=5)
    assert rt.plan_hash(h) != rt.plan_hash(f), "a changed setting changes the plan"


def test_plan_prints_every_step_and_no_secret(f: Fleet) -> None:
    text = render.plan(f)
    assert SECRET not in text
    assert "StrictHostKeyChecking=yes" in text and "BatchMode=yes" in text
    assert "StrictHostKeyChecking=no" not in text
    assert "/srv/dsv4/.venv/bin/python -m pairctl up --env-file" in text
    assert "docker run -d --name dsv4-fleet-test-router" in text
    assert text.count("## pair ") == 2


def test_remote_commands_keep_host_key_checking_and_announce_their_pid(f: Fleet) -> None:
    m = Machine("192.0.2.7", f.ssh, "head")  # TEST-NET-1: never this machine
    assert not m.local
    argv = m.argv(["launch/dspark_launch.sh", "up"], cwd="/srv/dsv4", announce=True)
    assert argv[:9] == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "ServerAliveInterval=15",
    ]
    assert argv[-1] == f"echo {PID_TAG} $$; cd /srv/dsv4 && exec launch/dspark_launch.sh up"
    assert is_local_address("127.0.0.1") and not is_local_address("192.0.2.7")
    local = Machine("127.0.0.1", f.ssh, "head")
    assert local.argv(["true"]) == ["true"]


def test_pair_command_runs_from_the_heads_checkout(f: Fleet) -> None:
    """The pair's own `python -m pairctl up` on its head (never the bash launcher: one
    process per pair command), from the head checkout's venv."""
    argv = pair_argv(f, f.pairs[1], "up", "--timeout", "60")
    assert argv == [
        "/srv/dsv4/.venv/bin/python",
        "-m",
        "pairctl",
        "up",
        "--env-file",
        f.pairs[1].remote_env_file,
        "--recipe",
        "/srv/dsv4/recipes/dsv4-flash-dspark.yaml",
        "--timeout",
        "60",
    ]


def test_env_file_on_the_head_must_match(f: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    p = f.pairs[0]
    good = hashlib.sha256(p.env_file.read_bytes()).hexdigest()
    answers = {
        "same": Result(0, f"{good}  {p.remote_env_file}\n", ""),
        "other": Result(0, f"{'0' * 64}  {p.remote_env_file}\n", ""),
        "missing": Result(1, "", "sha256sum: No such file or directory"),
        "ssh": Result(255, "", "Host key verification failed."),
    }
    for case, needle in (
        ("same", None),
        ("other", "differs"),
        ("missing", "is missing"),
        ("ssh", "Host key"),
    ):
        monkeypatch.setattr(Machine, "run", lambda self, argv, **kw: answers[case])  # noqa: B023
        why = env_file_matches(f, p)
        assert (why is None) if needle is None else (needle in why), (case, why)


def test_status_shows_the_routers_view_of_each_pair(f: Fleet) -> None:
    a, b = f.pairs
    st = ops.FleetStatus(
        {a.pair_id: view(a, True), b.pair_id: view(b, False)},
        [{"name": "dsv4-fleet-test-router", "state": "running", "plan": "x"}],
        "",
        rt.RouterView(True, True, "ready", {a.endpoint: True, b.endpoint: False}),
    )
    text = render.status_text(f, st)
    assert "ready, 1/2 worker(s) healthy" in text
    line_b = next(x for x in text.splitlines() if x.startswith("pair-b"))
    assert "not healthy (ConnectionError)" in line_b and "DOWN" in line_b
    js = st.to_json(f)
    assert js["router"]["workers_by_pair"] == {"pair-a": True, "pair-b": False}


def test_scrape_config_covers_the_router_and_every_pair_head(f: Fleet) -> None:
    cfg = monitoring.scrape_config(f)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["dsv4-router"]["static_configs"][0]["targets"] == ["10.9.0.50:29000"]
    pairs = jobs["dsv4-pairs"]["static_configs"]
    assert [(c["targets"], c["labels"]["pair"]) for c in pairs] == [
        (["10.9.0.11:8000"], "pair-a"),
        (["10.9.0.21:8000"], "pair-b"),
    ]
    assert all(c["labels"]["fleet"] == "test" for c in pairs)


def test_interrupt_reaches_a_running_launchers_whole_process_group(f: Fleet) -> None:
    """Ctrl-C of `fleet up` must reach each booting launcher and its children (the launcher's
    trap then tears its boot down); they run in sessions of their own, so the fleet sends
    SIGINT to each process group explicitly."""
    m = Machine("127.0.0.1", f.ssh, "head")
    proc = m.popen(["sleep", "30"])
    running = ops.Running()
    running.add("pair-x", m, proc.pid)
    buf = io.StringIO()
    running.interrupt_all(ops.Out(buf))
    assert proc.wait(10) != 0 and "interrupting its launcher" in buf.getvalue()
