"""The launcher's own clients of the pair: they send VLLM_API_KEY when the pair has one and
never go through an HTTP(S)_PROXY of the operator's shell (tried against the twin, which
enforces the key on /v1 as vLLM 0.33 does)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from pairctl.gate import run_for_pair
from pairctl.lifecycle.steps import probe_health
from pairctl.status.metrics import scrape
from pairctl.status.watch import KeyRejected, probe_token
from tests.support.twin import Twin, free_port, wait_http

REPO = Path(__file__).resolve().parents[1]

KEY = "sk-pair-test-key"


def dead_port() -> int:
    """A port nothing listens on (a proxy that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def keyed_twin(tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    twin = Twin(
        ["dsv4", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"],
        tmp_path_factory.mktemp("keyed"),
        "keyed",
        env={"VLLM_API_KEY": KEY},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20)  # /health is unguarded
        yield f"http://127.0.0.1:{port}"
    finally:
        twin.stop()


def test_key_is_required_on_v1_and_sent_by_our_probes(keyed_twin: str) -> None:
    r = requests.get(keyed_twin + "/v1/models", timeout=5)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    h = probe_health(keyed_twin)
    assert not h.healthy and "401" in h.detail and "VLLM_API_KEY" in h.detail
    h = probe_health(keyed_twin, api_key=KEY)
    assert h.healthy and h.models == ["dsv4"] and h.simulator
    sample, err = scrape(keyed_twin, api_key=KEY)
    assert sample is not None, err
    with pytest.raises(KeyRejected):  # the watchdog without the key: 401, a key problem
        probe_token(keyed_twin, timeout=10)
    assert probe_token(keyed_twin, timeout=10, api_key=KEY) is None


def test_probes_ignore_a_proxy_in_the_environment(
    keyed_twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = f"http://127.0.0.1:{dead_port()}"
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(var, proxy)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(requests.exceptions.ProxyError):  # what a plain client would do
        requests.get(keyed_twin + "/health", timeout=5)
    assert probe_health(keyed_twin, api_key=KEY).healthy
    assert scrape(keyed_twin, api_key=KEY)[0] is not None
    assert probe_token(keyed_twin, timeout=10, api_key=KEY) is None


def test_gate_gets_the_key_and_bypasses_the_proxy(
    keyed_twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up --gate` runs the gate in its own process: the pair's key reaches the endpoint
    (in the session's headers, not the environment or a command line) and a proxy in the
    operator's environment is not put between the gate and the pair."""
    proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(var, proxy)
    for var in ("NO_PROXY", "no_proxy", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert run_for_pair(keyed_twin, KEY) == 0
    assert run_for_pair(keyed_twin, None) == 1  # the key is what let it in: 401 without


def test_the_gate_script_reads_the_key_from_the_env(keyed_twin: str, tmp_path: Path) -> None:
    """bench/quality_ref_dspark.py takes OPENAI_API_KEY as its --api-key default."""
    argv = [sys.executable, "-m", "bench.quality_ref_dspark", "--url", keyed_twin]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    ok = subprocess.run(argv, env=dict(env, OPENAI_API_KEY=KEY), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout[-1500:] + ok.stderr[-1500:]
    # A 401 is final: the gate says so at once instead of waiting out --ready-timeout-s.
    slow = [*argv, "--ready-timeout-s", "600"]
    bad = subprocess.run(slow, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "401" in bad.stdout + bad.stderr
