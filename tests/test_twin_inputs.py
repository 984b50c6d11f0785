"""The twin takes bad input as vLLM 0.33 does: it enforces ``--api-key`` on /v1
(vllm/entrypoints/serve/middleware/authenticate.py), never prints a key or an unknown flag's
value, binds its port before booting (vllm/entrypoints/launchers/launcher.py, setup_server),
and refuses counts below 1 instead of dividing by them. Each failed on the code before."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import requests

from sim.twin.__main__ import main as twin_main
from tests.support.twin import Twin, free_port, wait_http

KEY = "abc123-twin-key"
ODD = "zz-not-a-flag-value-77"


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-batched-tokens", "-tp"])
def test_truth_refuses_counts_below_one(flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        twin_main(["truth", flag, "-3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "must be >= 1, got -3" in err and "Traceback" not in err


def test_api_key_is_enforced_and_never_printed(tmp_path: Path) -> None:
    port = free_port()
    argv = ["dsv4", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"]
    twin = Twin([*argv, "--api-key", KEY, "--frobnicate", ODD], tmp_path, "keyed")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health", timeout=30)  # unguarded, as in vLLM
        r = requests.get(base + "/v1/models", timeout=5)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        ok = requests.get(
            base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5
        )
        assert ok.status_code == 200
        truth = requests.get(base + "/twin/truth", timeout=5).text
        assert KEY not in truth and ODD not in truth
        assert json.loads(truth)["serve_args"]["api_key"] == "***"
    finally:
        twin.stop()
    log = twin.log()
    assert KEY not in log and ODD not in log
    assert "ignoring unknown flag --frobnicate" in log
    assert "'api_key': '***'" in log  # vLLM's redact_sensitive_args in non-default args


def test_a_taken_port_ends_the_boot_before_it_starts(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        twin = Twin(
            ["dsv4", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"],
            tmp_path,
            "busy",
        )
        try:
            assert twin.wait_exit(30) == 1
        finally:
            twin.stop()
    log = twin.log()
    assert "OSError: [Errno 98] Address already in use" in log
    assert "Loading model" not in log and "Initializing a V1 LLM engine" not in log
