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

from pairctl.config import parse_env
from pairctl.gate import gate_env
from pairctl.lifecycle import probe_health
from pairctl.recipe import load_recipe
from pairctl.resolved import resolve
from pairctl.status.pair import scrape
from pairctl.status.watch import probe_token
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
    assert probe_token(keyed_twin, timeout=10) is not None  # the watchdog without the key: 401
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


def test_gate_gets_the_key_by_env_and_bypasses_the_proxy() -> None:
    env = {
        "PAIR_ID": "pair-a",
        "SPARK1": "10.0.0.1",
        "SPARK2": "10.0.0.2",
        "MODEL_PATH": "/m",
        "NCCL_SOCKET_IFNAME": "e",
        "GLOO_SOCKET_IFNAME": "e",
    }
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    keyed = resolve(parse_env(dict(env, VLLM_API_KEY=KEY)), recipe)
    out = gate_env(keyed, {"NO_PROXY": "corp.local"})
    assert out["OPENAI_API_KEY"] == KEY and out["NO_PROXY"] == "corp.local,10.0.0.1"
    assert "OPENAI_API_KEY" not in gate_env(resolve(parse_env(env), recipe), {})


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
