"""Waits, ports and windows bounded; a refused key and Ctrl-C answered in one true line.

Each case failed on the code before: `inf` (or 1e309) was a wait without end for `sentinel
record --live-s`, the gate's `--ready-timeout-s` and `bench.headline_real --boot-timeout-s`;
ports above 65535 passed; `status --watch`/`watch` took refresh intervals that print 40 lines
a second; a 401 was "'data' (is the server up...)" from `sim.diffcheck record` and "set
--api-key" (a flag it lacks) from `sentinel record`; Ctrl-C in the gate's readiness wait was
a traceback, and `status --watch`/`watch` exited 7/0 on SIGINT where their help says 130.
Against the mock server (tests/fakes/mock_openai.py), the fake pair and closed loopback ports.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from pairctl.cli.frontdoor import UsageError, parse
from pairctl.fleet import cli as fleet_cli
from pairctl.gate import cli as gate_cli
from pairctl.sentinel import record
from sim.diffcheck import cli as diffcheck_cli
from tests.fakes.fakepair import FAKES, LAUNCHER, Env, free_port
from tests.fakes.mock_openai import MockConfig, MockServer

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
KEY = "sk-right-key-7731"
WRONG = "sk-wrong-key-0042"
ENDLESS = ["inf", "Infinity", "1e309", "nan", "1e12"]


def refused(main, argv: list[str], capsys) -> str:
    """``main(argv)`` stops with argparse's usage error; its last line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ---- durations: finite, at most a week ----------------------------------------------------------
@pytest.mark.parametrize("value", ENDLESS)
def test_sentinel_record_live_s_refuses_an_endless_wait(value: str, capsys) -> None:
    line = refused(record.parse_args, ["--url", "127.0.0.1:1", "--live-s", value], capsys)
    assert "--live-s: must be >= 0 and <= 604800 seconds" in line and value in line


@pytest.mark.parametrize("value", ENDLESS)
def test_gate_ready_timeout_refuses_an_endless_wait(value: str, capsys) -> None:
    line = refused(gate_cli.parse_args, ["--ready-timeout-s", value], capsys)
    assert "--ready-timeout-s: must be > 0 and <= 604800 seconds" in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--boot-timeout-s", "inf"], "--boot-timeout-s: must be > 0 and <= 604800 seconds"),
        (["--ports", "70000,70001"], "--ports: must be a port number 1-65535, got '70000'"),
        (["--ports", "8101,0"], "--ports: must be a port number 1-65535, got '0'"),
    ],
)
def test_headline_real_refuses_an_endless_boot_wait_and_ports_past_65535(
    argv: list[str], needle: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.headline_real", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == EXIT_USAGE, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--boot-timeout", "inf"], "--boot-timeout: must be > 0"),
        (["--port", "70000"], "--port: must be a port number 1-65535"),
        (["--master-port", "0"], "--master-port: must be a port number 1-65535"),
    ],
)
def test_diffcheck_peer_loss_bounds_its_wait_and_ports(argv, needle, tmp_path, capsys) -> None:
    line = refused(diffcheck_cli.main, ["peer-loss", "--out", str(tmp_path / "o"), *argv], capsys)
    assert needle in line


@pytest.mark.parametrize("argv", [["--probe-timeout", "inf"], ["--backoff", "1e309"]])
def test_watch_waits_are_finite(argv: list[str]) -> None:
    with pytest.raises(UsageError, match="must be > 0 and <= 604800 seconds"):
        parse(["watch", *argv])


@pytest.mark.parametrize("value", ["-5", "0", "1e9", "99999999999"])
def test_fleet_up_timeout_is_whole_seconds_up_to_a_week(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        fleet_cli.build_parser().parse_args(["up", "--timeout", value])
    assert e.value.code == EXIT_USAGE
    assert "--timeout: must be" in capsys.readouterr().err


# ---- refresh windows with a floor ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["status", "--watch", "--interval", "0.025"], "at least 0.5 s: status --watch"),
        (["watch", "--interval", "0.025"], "at least 1 s: watch probes"),
    ],
)
def test_refresh_intervals_that_flood_the_terminal_are_refused(argv, needle) -> None:
    with pytest.raises(UsageError, match=needle):
        parse(argv)
    assert parse(argv[:-1] + ["2"]).interval == 2  # an ordinary one passes
    assert parse(["status", "--interval", "0.2"]).interval == 0.2  # one reading: no floor


def test_sentinel_record_live_window_has_a_floor(capsys) -> None:
    argv = ["--url", "127.0.0.1:1", "--live-s", "3", "--window-s", "0.025"]
    assert "--window-s: must be >= 1 and" in refused(record.parse_args, argv, capsys)


# ---- a refused API key, named by where the key comes from -------------------------------------
def test_sentinel_record_names_vllm_api_key_not_a_flag_it_lacks(monkeypatch, capsys) -> None:
    monkeypatch.setenv("VLLM_API_KEY", WRONG)
    with MockServer(MockConfig(api_key=KEY)) as m:
        rc = record.main(["--url", m.url, "--gate-rounds", "1"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED, err
    assert "HTTP 401" in err and "refused the API key given as VLLM_API_KEY" in err
    assert "OPENAI_API_KEY" not in err and "given as --api-key" not in err and WRONG not in err


def test_sentinel_record_without_a_key_says_set_vllm_api_key(monkeypatch, capsys) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with MockServer(MockConfig(api_key=KEY)) as m:
        rc = record.main(["--url", m.url, "--gate-rounds", "1"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED and "requires an API key: set VLLM_API_KEY" in err, err


@pytest.mark.parametrize("given", [WRONG, None])
def test_diffcheck_record_says_the_key_was_refused_not_data(given, tmp_path, capsys) -> None:
    out = tmp_path / "snap.json"
    with MockServer(MockConfig(api_key=KEY)) as m:
        argv = ["record", "--url", m.url, "--out", str(out)]
        rc = diffcheck_cli.main(argv + (["--api-key", given] if given else []))
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and not out.exists()
    assert "'data'" not in err and "is the server up" not in err, err
    want = "refused the API key given with --api-key" if given else "requires an API key"
    assert "HTTP 401" in err and want in err and WRONG not in err


def test_diffcheck_record_with_the_right_key_gets_past_the_model_list(tmp_path, capsys) -> None:
    from sim.diffcheck import probe

    with MockServer(MockConfig(api_key=KEY, model_id="m-1")) as m:
        assert probe.served_model(m.url, KEY) == ("m-1", 0)


# ---- Ctrl-C: exit 130 and one line ---------------------------------------------------------------
def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real child that takes SIGINT as a terminal's Ctrl-C does (a background job may
    inherit SIGINT ignored; the child gets the default back before it starts)."""
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_line(stream, needle: str, timeout: float = 60) -> str:
    """Read ``stream`` until a line holds ``needle`` (the child is where it should be)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return line
    raise AssertionError(f"{needle!r} never came: {''.join(seen)[-2000:]}")


def interrupt(proc: subprocess.Popen, sig: int = signal.SIGINT) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_ctrl_c_in_the_gates_readiness_wait_is_one_line_and_130() -> None:
    closed = free_port()  # nothing listens: the gate waits, saying so on stderr
    proc = start(
        [sys.executable, "-m", "pairctl.gate", "--url", f"127.0.0.1:{closed}"]
        + ["--ready-timeout-s", "120"]
    )
    assert proc.stderr is not None
    wait_for_line(proc.stderr, "waiting for")
    rc, _out, err = interrupt(proc)
    assert rc == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1].endswith("gate: interrupted")


def pair_env(pair: Env) -> dict[str, str]:
    return dict(
        os.environ,
        PATH=f"{FAKES}:{os.environ['PATH']}",
        FAKE_STATE=str(pair.state_path),
        FAKE_LOG=str(pair.log_path),
        FAKE_PY=sys.executable,
        PAIRCTL_PYTHON=sys.executable,
        XDG_RUNTIME_DIR=str(pair.tmp),
    )


def test_ctrl_c_ends_status_watch_with_130(pair: Env) -> None:
    argv = [str(LAUNCHER), "status", "--watch", "--json", "--interval", "0.5"]
    proc = start([*argv, "--env-file", str(pair.env_file)], pair_env(pair))
    assert proc.stdout is not None
    json.loads(wait_for_line(proc.stdout, "verdict"))  # a reading is out: the loop runs
    rc, _out, err = interrupt(proc)
    assert rc == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "status: interrupted"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, 0)])
def test_watch_ends_130_on_ctrl_c_and_0_on_systemds_sigterm(pair: Env, sig, code) -> None:
    argv = [str(LAUNCHER), "watch", "--interval", "1", "--canary-every", "0"]
    proc = start([*argv, "--env-file", str(pair.env_file)], pair_env(pair))
    assert proc.stdout is not None
    wait_for_line(proc.stdout, "watching ")
    rc, out, err = interrupt(proc, sig)
    assert rc == code, (out, err)
    assert f"{signal.Signals(sig).name}: watchdog stopped" in out
    assert "Traceback" not in err


def test_the_mock_refuses_v1_without_the_key_as_vllm_does() -> None:
    import requests

    with MockServer(MockConfig(api_key=KEY)) as m:
        r = requests.get(m.url + "/v1/models", timeout=5)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert requests.get(m.url + "/health", timeout=5).status_code == 200
        ok = requests.get(m.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
