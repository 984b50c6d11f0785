"""pairctl.endpoint.Endpoint: a URL parsed once, at the edge, and handed down as one object.

The benches and the quality gate used to normalise --url, then normalise it again, split it
per request and strip slashes in three places; these tests follow a --url from the command
line to the requests and count the parses.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pytest

import pairctl.endpoint as pe
from bench import bench_conc
from bench import quality_ref_dspark as gate_entry
from bench.benchlib import endpoint as bench_endpoint
from bench.benchlib import promm, runner
from pairctl import gate
from pairctl.endpoint import Endpoint, endpoint_arg
from tests.fakes.mock_openai import MockConfig, MockServer

KEY = "sk-never-printed"


def test_parse_splits_once_and_keeps_todays_rules() -> None:
    ep = Endpoint.parse("h:8000/v1/", api_key=KEY, session_id="s1")
    parts = (ep.base, ep.scheme, ep.host, ep.port, ep.path)
    assert parts == ("http://h:8000", "http", "h", 8000, "")
    assert str(ep) == "http://h:8000" and ep.url("/v1/models") == "http://h:8000/v1/models"
    assert ep.headers() == {"Authorization": f"Bearer {KEY}", "X-Session-ID": "s1"}
    assert KEY not in repr(ep) and KEY not in str(ep) and KEY not in f"{ep}"
    proxied = Endpoint.parse("http://h/proxy/v1")
    assert (proxied.base, proxied.port, proxied.path) == ("http://h/proxy", 80, "/proxy")
    assert Endpoint.parse("https://h", schemes=("http", "https")).port == 443
    assert bench_endpoint.Endpoint is Endpoint  # the benches' name for the same object


def test_for_host_brackets_ipv6_and_with_auth_does_not_reparse(monkeypatch) -> None:
    assert Endpoint.for_host("10.0.0.1", 8000).base == "http://10.0.0.1:8000"
    v6 = Endpoint.for_host("fd00::1", 8000, api_key=KEY)
    assert v6.base == "http://[fd00::1]:8000" and v6.host == "fd00::1" and v6.api_key == KEY
    monkeypatch.setattr(pe, "urlsplit", lambda *a: pytest.fail("parsed again"))
    keyed = v6.with_auth(None, "conv-1").with_session("conv-2")
    assert keyed.api_key is None and keyed.session_id == "conv-2" and keyed.base == v6.base


@pytest.mark.parametrize("trust_env", [True, False])
def test_session_carries_the_headers_and_the_callers_proxy_choice(trust_env: bool) -> None:
    s = Endpoint.parse("h:1", api_key=KEY).session(trust_env=trust_env)
    assert s.trust_env is trust_env and s.headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; give the server's URL, e.g. http://HOST:8000"),
        ("ftp://h:8000", "'ftp://h:8000': scheme ftp:// is not supported here (use http://)"),
        ("http://h:99999", "'http://h:99999' has an invalid port (1-65535)"),
        ("http://h:8000/?x=1", "'http://h:8000/?x=1': give the base URL without ?query"),
    ],
)
def test_the_url_type_is_a_usage_error_with_todays_messages(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as e:
        endpoint_arg()(text)
    assert str(e.value).startswith(message)


class Seen:
    """Every URL-ish first argument the spied functions received."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def spy(self, module: Any, name: str, index: int, monkeypatch) -> None:
        real = getattr(module, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            self.args.append(a[index])
            return real(*a, **kw)

        monkeypatch.setattr(module, name, wrapper)


@pytest.fixture
def splits(monkeypatch) -> list[str]:
    """The texts pairctl.endpoint split (the one urlsplit there is)."""
    seen: list[str] = []
    real = pe.urlsplit

    def counting(url: str, *a: Any, **kw: Any):
        seen.append(url)
        return real(url, *a, **kw)

    monkeypatch.setattr(pe, "urlsplit", counting)
    return seen


def test_a_bench_url_is_parsed_once_and_every_request_gets_the_object(splits, monkeypatch):
    old = sys.getswitchinterval()
    seen = Seen()
    seen.spy(runner, "stream_request", 0, monkeypatch)
    seen.spy(runner, "open_connection", 0, monkeypatch)
    seen.spy(bench_endpoint, "wait_ready", 1, monkeypatch)
    seen.spy(promm, "scrape", 1, monkeypatch)
    cfg = MockConfig(ttft_s=0.01, step_s=0.005, tokens_per_step=(2,))
    try:
        with MockServer(cfg) as m:
            splits.clear()  # the mock's own m.endpoint
            argv = ["--url", m.url + "/v1/", "--api-key", KEY, "--concurrency", "1,2"]
            argv += ["--max-tokens", "8", "--warmups", "0", "--guard-interval-ms", "30"]
            argv += ["--guard-grace-ms", "200", "--settle-ms", "5", "--no-progress"]
            assert bench_conc.main(argv) == 0
    finally:
        sys.setswitchinterval(old)
    assert splits == [m.url + "/v1/"]  # the --url type, and nothing after it
    kinds = {type(a) for a in seen.args}
    assert kinds == {Endpoint}, kinds
    assert len({id(a) for a in seen.args}) == 1  # one object, handed down
    assert seen.args[0].api_key == KEY and seen.args[0].base == m.url


def test_the_gate_parses_its_url_once_in_and_out_of_process(splits, monkeypatch, capsys):
    ref = gate.load_reference(str(gate.DEFAULT_PROMPTS))
    right = {p["prompt"]: p["answer"] for p in ref["prompts"]}
    seen = Seen()
    seen.spy(gate, "Asker", 1, monkeypatch)  # Asker(session, endpoint, ...)
    seen.spy(gate, "wait_ready", 1, monkeypatch)
    with MockServer(MockConfig(answers=right)) as m:
        splits.clear()  # the mock's own m.endpoint
        assert gate_entry.main(["--url", m.url + "/v1"]) == 0
        assert splits == [m.url + "/v1"]
        assert {type(a) for a in seen.args} == {Endpoint} and len({id(a) for a in seen.args}) == 1
        assert gate.run_gate(m.endpoint) == 0  # in process, given an Endpoint: no parse at all
        assert gate.run_for_pair(m.endpoint, KEY) == 0
        assert splits == [m.url + "/v1"]
    assert "quality gate: 5/5 passed" in capsys.readouterr().out
