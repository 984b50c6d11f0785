"""The watchdog's policy (pairctl/status/watch.py) with injected probe/restart/clock, the lock
test, and the 1-token probe against a real simulator on loopback."""

from __future__ import annotations

import configparser
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pairctl import lock
from pairctl.status import watch
from tests.conftest import require
from tests.support.twin import Twin, free_port, wait_http

CFG = watch.WatchConfig(
    interval_s=10, failures=3, probe_timeout_s=5, backoff_s=30, backoff_max_s=100
)


class Script:
    """A probe answering from a script (None = a token came back), a restart with set exit
    codes, and a log."""

    def __init__(self, probes: list[str | None], restarts: list[int] = ()) -> None:
        self.probes, self.restarts = list(probes), list(restarts)
        self.restarted = 0
        self.lines: list[str] = []
        self.busy = False

    def probe(self) -> str | None:
        return self.probes.pop(0)

    def restart(self) -> int:
        self.restarted += 1
        return self.restarts.pop(0)

    def dog(self, cfg: watch.WatchConfig = CFG) -> watch.Watchdog:
        return watch.Watchdog(
            cfg, self.probe, self.restart, self.lines.append, busy=lambda: self.busy
        )


def test_failures_below_k_never_restart() -> None:
    s = Script([None, "HTTP 500", "timed out", None, "HTTP 500", "HTTP 500", None])
    dog = s.dog()
    waits = [dog.tick() for _ in range(7)]
    assert s.restarted == 0 and waits == [10] * 7
    assert "ok: a token again after 2 failed probe(s)" in s.lines
    assert sum("FAIL" in ln for ln in s.lines) == 4


def test_k_failures_in_a_row_restart_once_and_recover() -> None:
    s = Script([None, "x", "x", "x", None], restarts=[0])
    dog = s.dog()
    for _ in range(5):
        dog.tick()
    assert s.restarted == 1
    assert any("3 failed probes in a row: restarting" in ln for ln in s.lines)
    assert any(ln.startswith("restart 1: pair up again") for ln in s.lines)
    assert s.lines[-1] == "ok: the restarted pair generated a token (restart 1)"
    assert dog.failed == 0


def test_failed_restarts_back_off_doubling_to_the_cap() -> None:
    s = Script(["x"] * 6, restarts=[4, 3, 5, 0])
    dog = s.dog()
    waits = [dog.tick() for _ in range(6)]
    # probes 1-2 count up, 3 restarts (fails: 30 s), 4 again (60 s), 5 (cap 100), 6 works
    assert waits == [10, 10, 30, 60, 100, 10]
    assert s.restarted == 4
    assert any("up exit 4: boot failure" in ln for ln in s.lines)
    assert any("up exit 3: preflight FAIL" in ln for ln in s.lines)
    # the probe after a failed restart says so; a count never exceeds the threshold
    assert [ln.split(":")[0] for ln in s.lines if ln.startswith("FAIL")] == [
        "FAIL 1/3",
        "FAIL 2/3",
        "FAIL 3/3",
        "FAIL again after failed restart 1",
        "FAIL again after failed restart 2",
        "FAIL again after failed restart 3",
    ]
    s2 = Script(["x"] * 4 + [None, "x", "x", "x"], restarts=[4, 0, 0])
    dog = s2.dog()
    waits = [dog.tick() for _ in range(8)]
    assert waits[2] == 30 and waits[-1] == 10  # a success resets the backoff


def test_a_held_lock_pauses_counting() -> None:
    s = Script(["x", "x", "x"], restarts=[0])
    dog = s.dog()
    dog.tick()
    dog.tick()
    s.busy = True  # an operator runs up/down
    assert dog.tick() == 10 and dog.failed == 0 and s.probes == ["x"]
    assert any("holds its lock" in ln for ln in s.lines)
    s.busy = False
    dog.tick()
    assert s.restarted == 0


def test_lock_busy_sees_another_holder(tmp_path: Path) -> None:
    path = tmp_path / "pair.lock"
    assert lock.busy(str(path)) is False  # no lock file: nobody holds it
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert lock.busy(str(path)) is True
    assert lock.busy(str(path)) is False


def test_log_lines_carry_a_utc_timestamp(capsys) -> None:
    watch.printer("pair-a")("FAIL 1/3: x")
    line = capsys.readouterr().out.strip()
    assert line.endswith("watch pair-a: FAIL 1/3: x")
    assert line[4] == "-" and line[10] == "T" and line.split()[0].endswith("Z")


def test_probe_generates_one_token_from_the_simulator(tmp_path: Path) -> None:
    port = free_port()
    twin = Twin(
        ["m", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"],
        tmp_path,
        "twin",
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        assert watch.probe_token(f"http://127.0.0.1:{port}", timeout=10) is None
    finally:
        twin.stop()
    why = watch.probe_token(f"http://127.0.0.1:{port}", timeout=2)
    assert why is not None and f"127.0.0.1:{port}" in why


def test_probe_reports_an_endpoint_that_cannot_complete() -> None:
    from tests.fakes.mock_openai import MockConfig, MockServer

    # answers /v1/models, but its completions fail as a dead engine's do (HTTP 500)
    with MockServer(MockConfig(mode="http500")) as srv:
        why = watch.probe_token(f"http://127.0.0.1:{srv.port}", timeout=5)
    assert why is not None and "/v1/completions: HTTP 500" in why


@pytest.mark.parametrize("bad", [["--failures", "0"], ["--interval", "0"], ["--timeout", "x"]])
def test_watch_rejects_nonsense(bad: list[str], tmp_path: Path) -> None:
    from pairctl.cli import main as cli

    # exit 2 from the value check itself: the env file (missing) is never read
    assert cli.main(["watch", "--env-file", str(tmp_path / "none.env"), *bad]) == 2


UNIT = Path(__file__).resolve().parents[1] / "launch" / "dsv4-watch@.service"
UNIT_REPO = "/home/bird/DSv4-Flash-spark"


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # systemd keys are case-sensitive
    cp.read_string(UNIT.read_text())
    return cp


def test_unit_runs_the_launchers_watch_and_restarts_it() -> None:
    svc = _unit()["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert argv[0] == f"{UNIT_REPO}/launch/dspark_launch.sh" and argv[1] == "watch"
    assert svc["Restart"] in ("on-failure", "always") and svc[
        "RestartPreventExitStatus"
    ].split() == ["2", "9"]
    assert svc["WorkingDirectory"] == UNIT_REPO
    # the unit's options parse as the launcher's watch options (a missing env file is the
    # first thing to fail, exit 2; an option watch does not take would fail before that)
    repo = UNIT.parents[1]
    p = subprocess.run(
        [str(repo / "launch" / "dspark_launch.sh"), *argv[1:]],
        cwd=repo,
        env=dict(os.environ, PAIRCTL_PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2 and "env file" in p.stderr and "pair-a" not in p.stdout, p.stderr
    assert "does not apply" not in p.stderr and "unknown argument" not in p.stderr


def test_unit_has_no_secrets() -> None:
    text = UNIT.read_text()
    assert not re.search(r"(?im)^\s*Environment(File)?=", text), "secrets belong in the env file"
    assert not re.search(r"(?i)(TOKEN|SECRET|PASSWORD|API_KEY)\s*=", text)


def test_unit_verifies_with_systemd(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze not installed (Debian's systemd)")
    repo = str(UNIT.parents[1])
    unit = tmp_path / "dsv4-watch@pair-a.service"
    unit.write_text(UNIT.read_text().replace(UNIT_REPO, repo))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr
