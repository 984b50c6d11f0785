"""End to end: the watchdog (`launch/dspark_launch.sh watch`) on two netns test hosts (real
sshd, process runtime, simulator). Rank 1's process is killed under a serving pair; the
watchdog must notice within its interval, take the pair down and up again through the
launcher, leave it healthy with no process of the old generation behind, and stop cleanly
on SIGTERM (as systemd stops it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sim.rehearsal import hosts, pairenv
from tests.support.rehearsal import pair_fixture, run_launcher

pytestmark = pytest.mark.needs_netns

REPO = Path(__file__).resolve().parents[1]
PAIR_ID = "rehearsal"
INTERVAL_S, PROBE_TIMEOUT_S, FAILURES = 1, 5, 2

pair = pair_fixture("dsv4w")


def launch(pair: hosts.Pair, *args: str, timeout: float = 240) -> tuple[int, str]:
    res = run_launcher(pair, REPO, *args, timeout=timeout)
    out = res.stdout + res.stderr
    assert pairenv.FAKE_HF_TOKEN not in out, "the launcher printed HF_TOKEN"
    return res.returncode, out


def containers(host: hosts.Host) -> dict[str, dict]:
    """name -> docker inspect of every container on the host."""
    res = host.docker("ps", "-a", "-q", "--no-trunc")
    out = {}
    for cid in res.stdout.split():
        info = json.loads(host.docker("inspect", cid).stdout)[0]
        out[info["Name"].lstrip("/")] = info
    return out


def wait_for(path: Path, pattern: str, timeout: float, after: int = 0) -> tuple[float, str]:
    """Wait until a line matching ``pattern`` appears past byte ``after``; (when, line)."""
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        text = path.read_text()[after:]
        for line in text.splitlines():
            if rx.search(line):
                return time.monotonic(), line
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{path.read_text()}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_watchdog_restarts_a_pair_whose_rank1_died(pair: hosts.Pair, tmp_path: Path) -> None:
    pairenv.copy_overlays(pair, REPO)
    rc, out = launch(pair, "up", "--timeout", "120")
    assert rc == 0, out
    log = tmp_path / "watch.log"
    assert pair.env_file is not None
    with open(log, "w") as fh:
        dog = pair.h1.popen(
            [
                str(REPO / "launch" / "dspark_launch.sh"),
                "watch",
                "--env-file",
                str(pair.env_file),
                "--interval",
                str(INTERVAL_S),
                "--failures",
                str(FAILURES),
                "--probe-timeout",
                str(PROBE_TIMEOUT_S),
                "--backoff",
                "2",
                "--timeout",
                "120",
            ],
            env={"PAIRCTL_POLL_S": "0.5", "PYTHONUNBUFFERED": "1"},
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
        )
    try:
        wait_for(log, r"ok: the pair generated a token", 60)
        before = {h.name: containers(h) for h in pair.hosts}
        old_pids = [
            before[pair.h1.name][f"dsv4-{PAIR_ID}-rank0"]["State"]["Pid"],
            before[pair.h2.name][f"dsv4-{PAIR_ID}-rank1"]["State"]["Pid"],
        ]
        mark = len(log.read_text())
        killed_at = time.monotonic()
        os.kill(old_pids[1], signal.SIGKILL)  # rank 1's process dies under a serving pair

        noticed, _ = wait_for(log, r"FAIL 1/2: ", INTERVAL_S + PROBE_TIMEOUT_S + 5, mark)
        assert noticed - killed_at <= INTERVAL_S + PROBE_TIMEOUT_S + 2, noticed - killed_at
        wait_for(log, r"2 failed probes in a row: restarting the pair", 30, mark)
        wait_for(log, r"restart 1: pair up again after", 180, mark)
        wait_for(log, r"ok: the restarted pair generated a token", 30, mark)

        rc, out = launch(pair, "status", "--interval", "0.5")
        assert rc == 0, out
        assert f"dsv4-{PAIR_ID}-rank0 running" in out and f"dsv4-{PAIR_ID}-rank1 running" in out
        after = {h.name: containers(h) for h in pair.hosts}
        assert set(after[pair.h1.name]) == {f"dsv4-{PAIR_ID}-rank0"}, after
        assert set(after[pair.h2.name]) == {f"dsv4-{PAIR_ID}-rank1"}, after
        new_pids = [
            after[pair.h1.name][f"dsv4-{PAIR_ID}-rank0"]["State"]["Pid"],
            after[pair.h2.name][f"dsv4-{PAIR_ID}-rank1"]["State"]["Pid"],
        ]
        assert not set(new_pids) & set(old_pids)
        assert not [p for p in old_pids if alive(p)], "a process of the old pair survived"
    finally:
        dog.send_signal(signal.SIGTERM)  # what `systemctl stop` does
        stopped = dog.wait(60)
    text = log.read_text()
    assert stopped == 0, text
    assert "SIGTERM: watchdog stopped" in text
    for line in text.splitlines():
        if "watch rehearsal:" in line:
            assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ watch rehearsal: ", line), line

    rc, out = launch(pair, "down")
    assert rc == 0, out
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for h in pair.hosts for p in h.process_cmdlines()]
        if not left and not any(containers(h) for h in pair.hosts):
            break
        time.sleep(0.2)
    assert not left, f"orphans left: {left}"
