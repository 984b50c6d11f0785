"""The launcher's answers to an operator (fake docker/ssh/ip/ss from tests/fakes): options
that do not apply, port clashes, unwritable outputs, names that do not resolve, a launcher
run off SPARK1, status exit codes, logs failures, and preflight streaming while rank 1 is
slow. Exit codes as docs/INTERFACES.md lists them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pairctl.preflight import CHECKS, Need
from tests.fakes.fakepair import FAKES, LAUNCHER, Env, free_port

EXIT_RUNTIME, EXIT_USAGE, EXIT_PREFLIGHT, EXIT_DEGRADED, EXIT_DOWN = 1, 2, 3, 7, 8


def touched_nothing(pair: Env) -> bool:
    return pair.calls() == [] and pair.calls("ssh") == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("plan", "--json", "F"), "--json does not apply to plan"),
        (("plan", "--gate"), "--gate does not apply to plan"),
        (("status", "-f"), "-f does not apply to status"),
        (("down", "--timeout", "5"), "--timeout does not apply to down"),
        (("logs", "--src", "x"), "--src does not apply to logs"),
        (("down", "--", "--max-num-seqs", "8"), "does not apply to down"),
        (("status", "--json", "out.json"), "takes no FILE"),
        (("preflight", "--json"), "--json needs a FILE"),
        (("up", "--timeout", "0"), "at least 1"),
        (("up", "--timeout", "soon"), "whole number"),
        (("logs", "--tail", "-3"), "--tail"),
    ],
)
def test_options_that_do_not_apply_are_refused(pair: Env, args: tuple, needle: str) -> None:
    p = pair.run(*args)
    assert p.returncode == EXIT_USAGE, (args, p.stdout, p.stderr)
    assert needle in p.stderr, p.stderr
    assert touched_nothing(pair)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("watch", "--failures", "0"), "--failures"),
        (("watch", "--interval", "-1"), "--interval"),
        (("status", "--interval", "nan"), "--interval"),
    ],
)
def test_bad_numbers_for_status_and_watch_are_usage_errors(
    pair: Env, args: tuple, needle: str
) -> None:
    p = pair.run(*args)
    assert p.returncode == EXIT_USAGE and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(("port", "master"), [("8000", "8000"), ("", "8000")])
def test_master_port_equal_to_the_endpoint_port_is_a_config_error(
    pair: Env, port: str, master: str
) -> None:
    pair.values.update(PORT=port, MASTER_PORT=master)
    pair.write_env()
    for cmd in ("up", "plan", "preflight"):
        p = pair.run(cmd)
        assert p.returncode == EXIT_USAGE, (cmd, p.stderr)
        assert "MASTER_PORT=8000" in p.stderr and "PORT" in p.stderr.replace("MASTER_PORT", "")
        assert "set MASTER_PORT to another free port" in p.stderr
    assert touched_nothing(pair)


def test_preflight_json_to_a_missing_dir_fails_before_any_probe(pair: Env) -> None:
    p = pair.run("preflight", "--json", "/nonexistent/x.json")
    assert p.returncode == EXIT_USAGE, p.stderr
    assert "/nonexistent" in p.stderr and "does not exist" in p.stderr
    assert "Traceback" not in p.stderr
    assert touched_nothing(pair), "the check must come before the work"


def test_up_json_to_a_missing_dir_fails_before_the_lock_and_any_probe(pair: Env) -> None:
    import fcntl

    # another run holds the pair's lock: a bad --json must be reported before the lock wait
    with open(pair.tmp / "dsv4-launch-pair-a-127.0.0.1.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        p = pair.run("up", "--json", "/nonexistent/x.json")
    assert p.returncode == EXIT_USAGE, p.stderr
    assert "/nonexistent" in p.stderr and "does not exist" in p.stderr
    assert "another up/down" not in p.stderr and "Traceback" not in p.stderr
    assert touched_nothing(pair), "the check must come before the work"


def test_unresolvable_spark1_passes_nothing_about_it(pair: Env) -> None:
    pair.values["SPARK1"] = "no-such-host.invalid"
    pair.write_env()
    p = pair.run("preflight")
    out = p.stdout + p.stderr
    assert p.returncode == EXIT_PREFLIGHT, out
    assert "None" not in out
    assert "FAIL  PF-DISTINCT-NODES" in p.stdout and "SPARK1 does not resolve" in p.stdout
    about_spark1 = {c.id for c in CHECKS if Need.RANK0 in c.needs or Need.NAMES in c.needs}
    passed = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("PASS")}
    assert not passed & about_spark1, passed & about_spark1


def test_port_clash_free_preflight_names_each_port_once(pair: Env) -> None:
    p = pair.run("preflight")
    assert p.returncode == 0, p.stdout + p.stderr
    frees = [ln for ln in p.stdout.splitlines() if "free on SPARK1" in ln]
    assert len(frees) == 2 and len({ln.split("port ")[1] for ln in frees}) == 2, frees


def test_sync_overlays_off_spark1_is_refused_like_up(pair: Env) -> None:
    pair.state["hosts"]["h1"]["addrs"] = ["10.9.9.9"]  # this machine is not SPARK1
    pair.save()
    up = pair.run("up")
    sync = pair.run("sync-overlays")
    assert up.returncode == sync.returncode == EXIT_PREFLIGHT, sync.stdout + sync.stderr
    assert "FAIL  PF-SELF-IS-SPARK1" in sync.stdout and "nothing was copied" in sync.stderr
    assert not (pair.tmp / "overlays").exists()
    # no overlay copy went to rank 1 (sync-overlays unpacks with `tar -C STAGE -xf -`)
    assert not [c for c in pair.calls("ssh") if "tar -C" in " ".join(c["argv"])]


def _slow_ssh(tmp: Path, seconds: float) -> tuple[Path, Path]:
    """An ssh that hangs like an unreachable host, then fails as ssh does; it touches the
    returned marker file just before it gives up (the moment the test orders against)."""
    bin_dir = tmp / "slowbin"
    bin_dir.mkdir()
    gave_up = tmp / "ssh-gave-up"
    ssh = bin_dir / "ssh"
    ssh.write_text(
        f"#!/bin/sh\nsleep {seconds}\ntouch '{gave_up}'\n"
        'echo "ssh: connect to host 127.0.0.2 port 22: Connection timed out" >&2\nexit 255\n'
    )
    ssh.chmod(0o755)
    return bin_dir, gave_up


def test_preflight_streams_while_rank1_is_unreachable(dead_pair: Env) -> None:
    """Rank 0's verdicts print while ssh to rank 1 still hangs; what is awaited is said.
    Held to order, not to a clock: rank 0's line arrives before the hanging ssh gives up
    (its marker file does not exist yet), the ssh verdict after it."""
    slow_bin, gave_up = _slow_ssh(dead_pair.tmp, 5)
    env = dict(
        os.environ,
        PATH=f"{slow_bin}:{FAKES}:{os.environ['PATH']}",
        FAKE_STATE=str(dead_pair.state_path),
        FAKE_LOG=str(dead_pair.log_path),
        FAKE_PY=sys.executable,
        PAIRCTL_PYTHON=sys.executable,
        XDG_RUNTIME_DIR=str(dead_pair.tmp),
    )
    proc = subprocess.Popen(
        [str(LAUNCHER), "up", "--env-file", str(dead_pair.env_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ssh_done_at: dict[str, bool] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        words = line.split()
        if len(words) > 1 and words[1].startswith("PF-"):
            ssh_done_at.setdefault(words[1], gave_up.exists())
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(30) == EXIT_PREFLIGHT
    assert "probing rank 0 (this machine, 127.0.0.1) and rank 1 over ssh (127.0.0.2" in err
    assert ssh_done_at["PF-SELF-IS-SPARK1"] is False, ssh_done_at  # before ssh gave up
    assert ssh_done_at["PF-SSH"] is True, ssh_done_at
    assert dead_pair.runs() == [] and dead_pair.removes() == []


def test_status_exit_codes_down_degraded_healthy(pair: Env) -> None:
    (pair.tmp / "dead").mkdir()
    dead_pair = Env(pair.tmp / "dead", free_port())
    p = dead_pair.run("status")
    assert p.returncode == EXIT_DOWN, p.stdout + p.stderr
    assert "DOWN" in p.stdout and "why down" in p.stdout
    p = pair.run("status")  # something answers at SPARK1:PORT, but no container of ours runs
    assert p.returncode == EXIT_DOWN, p.stdout  # not this pair's endpoint: no figures shown
    assert "container dsv4-pair-a-rank1 missing" in p.stdout
    assert "not this pair's endpoint" in p.stdout and "decode:" not in p.stdout
    assert pair.run("up").returncode == 0
    p = pair.run("status", "--interval", "0.2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "HEALTHY" in p.stdout and "dsv4-pair-a-rank1 running, up " in p.stdout
    assert "running 2, waiting 1" in p.stdout and "decode:" in p.stdout
    pair.state = pair.load()
    pair.state["hosts"]["h2"]["containers"][0]["State"] = "exited"
    pair.save()
    p = pair.run("status", "--interval", "0.2")
    assert p.returncode == EXIT_DEGRADED and "rank1 exited" in p.stdout, p.stdout


def test_status_json_is_the_documented_document(pair: Env) -> None:
    assert pair.run("up").returncode == 0
    p = pair.run("status", "--json", "--interval", "0.2")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema_version"] == 2 and doc["verdict"] == "healthy" and doc["exit_code"] == 0
    assert doc["endpoint"]["ours"] == "yes"
    assert [r["state"] for r in doc["ranks"]] == ["running", "running"]
    assert all(r["uptime_s"] is not None and r["uptime_s"] >= 0 for r in doc["ranks"])
    assert doc["endpoint"]["models"] == ["/models/dsv4"]
    assert doc["serving"]["running"] == 2 and doc["serving"]["window"] == "interval"
    assert doc["running_plan"] == doc["current_plan"]


def test_status_says_when_a_long_rate_window_starts(pair: Env) -> None:
    """A rate window of seconds is a wait a person notices: once the first /metrics scrape
    is in, status says on stderr that it is measuring (stdout stays the one document); a
    short one says nothing."""
    assert pair.run("up").returncode == 0
    p = pair.run("status", "--json", "--interval", "3")
    assert p.returncode == 0, p.stderr
    assert "status: measuring the serving rates over 3 s..." in p.stderr
    assert json.loads(p.stdout)["serving"]["window_s"] >= 3
    quick = pair.run("status", "--json", "--interval", "0.2")
    assert "measuring" not in quick.stderr


def test_status_watch_json_streams_readings(pair: Env) -> None:
    assert pair.run("up").returncode == 0
    env = dict(
        os.environ,
        PATH=f"{FAKES}:{os.environ['PATH']}",
        FAKE_STATE=str(pair.state_path),
        FAKE_PY=sys.executable,
        PAIRCTL_PYTHON=sys.executable,
    )
    argv = [str(LAUNCHER), "status", "--watch", "--json", "--interval", "0.5"]
    proc = subprocess.Popen(
        [*argv, "--env-file", str(pair.env_file)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.terminate()
        proc.wait(10)
    assert [d["verdict"] for d in docs] == ["healthy"] * 3
    assert all(d["serving"]["window"] == "interval" for d in docs)


def test_logs_of_an_unreachable_rank1_says_what_failed(pair: Env) -> None:
    pair.state["ssh_fail"] = "ssh: connect to host 127.0.0.2 port 22: No route to host"
    pair.save()
    p = pair.run("logs", "--rank", "1")
    assert p.returncode == EXIT_RUNTIME, p.stderr
    assert "cannot ask docker on rank 1 (127.0.0.2) over ssh" in p.stderr
    assert "No route to host" in p.stderr


def test_logs_without_a_container_says_so(pair: Env) -> None:
    p = pair.run("logs", "--rank", "1")
    assert p.returncode == EXIT_RUNTIME
    assert "no container dsv4-pair-a-rank1" in p.stderr and "status" in p.stderr


def test_pair_status_of_is_the_python_interface(pair: Env, monkeypatch) -> None:
    """What a tool built on pairs calls: the same data as `status --json`, as a dataclass."""
    from pairctl.pair.config import ConfigError
    from pairctl.status.pair import pair_status_of

    monkeypatch.setenv("PATH", f"{FAKES}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", str(pair.state_path))
    monkeypatch.setenv("FAKE_PY", sys.executable)
    st = pair_status_of(pair.env_file, interval_s=0.1)
    # No container of this pair yet: whatever answers at SPARK1:PORT is not shown as ours.
    assert st.verdict == "down" and st.exit_code == EXIT_DOWN
    assert not st.endpoint.healthy and st.endpoint.ours == "no" and st.serving is None
    assert [r.state for r in st.ranks] == ["missing", "missing"]
    assert pair.run("up").returncode == 0
    st = pair_status_of(pair.env_file, interval_s=0.1)
    assert st.endpoint.healthy and st.serving is not None and st.serving.running == 2
    assert json.loads(json.dumps(st.to_dict()))["pair_id"] == "pair-a"
    with pytest.raises(ConfigError):
        pair_status_of(pair.tmp / "missing.env")
