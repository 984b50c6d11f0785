"""Bad inputs to the benches refused before any work, and Ctrl-C answered right.

Each case failed on the code before: a traceback, a late error after the run, an "ok" without
a figure, or a bound that was not there. Against the mock server (tests/fakes/mock_openai.py).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import bench_conc, bench_ctx, bench_interfere, bench_router
from bench.benchlib import EXIT_INTERRUPTED, EXIT_USAGE, MAX_CONCURRENCY
from bench.benchlib.response import StreamResult
from pairctl.endpoint import Endpoint, NotReady, cause, wait_ready
from tests.fakes.mock_openai import MockConfig, MockServer

FAST = ["--warmups", "0", "--guard-interval-ms", "30", "--guard-grace-ms", "200"]
FAST += ["--backoff-s", "0.05", "--settle-ms", "5", "--no-progress"]


@pytest.fixture(autouse=True)
def _keep_switch_interval():
    old = sys.getswitchinterval()
    yield
    sys.setswitchinterval(old)


def usage_line(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ---- output paths the file system refuses, even to root --------------------------------------
@pytest.mark.parametrize("main", [bench_ctx.main, bench_conc.main])
def test_json_under_proc_is_refused_before_any_request(main, capsys) -> None:
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.005)) as m:
        line = usage_line(main, ["--url", m.url, "--json", "/proc/x", *FAST], capsys)
        assert m.records() == []
    assert "--json: /proc/x is not writable" in line


def test_plot_with_a_non_image_name_is_refused_before_the_run(tmp_path, capsys) -> None:
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.005)) as m:
        argv = ["--url", m.url, "--plot", str(tmp_path / "x.txt"), *FAST]
        line = usage_line(bench_ctx.main, argv, capsys)
        assert m.records() == []
    assert "--plot: must end in .png" in line and "x.txt" in line
    assert not (tmp_path / "x.txt").exists()  # the probe leaves nothing behind


# ---- sizes checked against the server, and upper bounds ---------------------------------------
def test_a_depth_above_max_model_len_is_refused_before_any_prompt(capsys) -> None:
    body = {"object": "list", "data": [{"id": "mock-model", "max_model_len": 8192}]}
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.005, models_body=body)) as m:
        with pytest.raises(SystemExit) as e:
            bench_ctx.main(["--url", m.url, "--depths", "1k,2m", *FAST])
        assert m.records() == []  # not even the test request
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("refused: --depths 2097152 plus --max-tokens 256 exceed")
    assert "max_model_len 8192" in err[-1] and "up to 7936" in err[-1]


def test_too_deep_knows_nothing_without_max_model_len() -> None:
    assert bench_ctx.too_deep([1 << 21], 256, None) is None
    assert bench_ctx.too_deep([1024], 256, 1280) is None
    assert bench_ctx.too_deep([1025], 256, 1280) is not None


def test_concurrency_has_an_upper_bound(capsys) -> None:
    line = usage_line(bench_conc.main, ["--concurrency", "1,100000"], capsys)
    assert f"--concurrency: needs whole numbers <= {MAX_CONCURRENCY}, got 100000" in line
    line = usage_line(
        bench_router.main, ["--pairs", "a:1,b:2", "--overhead-concurrency", "9999"], capsys
    )
    assert f"<= {MAX_CONCURRENCY}" in line


@pytest.mark.parametrize(
    "pairs", ["http://u:8000,http://u:8000", "u:8000,http://u:8000/v1", "a:1,b:2,a:1/"]
)
def test_router_bench_refuses_one_endpoint_twice(pairs: str, capsys) -> None:
    line = usage_line(bench_router.main, ["--pairs", pairs], capsys)
    assert "is given twice" in line


# ---- no figure is not "ok" -------------------------------------------------------------------
def test_interfere_without_a_figure_is_an_error() -> None:
    ms = 1_000_000
    # The decoding stream ended after two token events: too few gaps for a rate.
    dec = StreamResult(
        ok=True,
        t_request_ns=0,
        t_first_token_ns=10 * ms,
        t_last_token_ns=11 * ms,
        t_done_ns=11 * ms,
        token_chunk_ns=[10 * ms, 11 * ms],
        prompt_tokens=10,
        completion_tokens=2,
        n_events=2,
    )
    pre = StreamResult(
        ok=True,
        t_request_ns=10 * ms + ms // 2,
        t_first_token_ns=40 * ms,
        t_last_token_ns=40 * ms,
        t_done_ns=40 * ms,
        token_chunk_ns=[40 * ms],
        prompt_tokens=1000,
        completion_tokens=1,
        n_events=1,
    )
    m = bench_interfere.interfered_metrics({"decode": dec, "prefill": pre})
    assert m["decode_tok_s"] is None
    assert m["error"] and "no figure" in m["error"]


# ---- Ctrl-C ----------------------------------------------------------------------------------
def test_ctrl_c_is_one_line_exit_130_and_the_points_so_far_are_written(
    tmp_path, capsys, monkeypatch
) -> None:
    real = bench_ctx.Ladder.depth
    calls = []

    def depth(self, d):
        calls.append(d)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, d)

    monkeypatch.setattr(bench_ctx.Ladder, "depth", depth)
    out = tmp_path / "ctx.json"
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.002, tokens_per_step=(2,))) as m:
        argv = ["--url", m.url, "--depths", "100,200", "--max-tokens", "8", "--json", str(out)]
        rc = bench_ctx.main([*argv, *FAST])
    assert rc == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == f"interrupted; 2 point(s) written to {out}"
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == EXIT_INTERRUPTED and "interrupted (Ctrl-C)" in doc["exit_reasons"]
    assert [p["label"] for p in doc["points"]] == ["baseline run0", "depth 100 run0"]


def test_ctrl_c_outside_a_run_is_one_line_too(monkeypatch, capsys) -> None:
    from bench.benchlib import cli

    def main() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        cli.entry(main)
    assert e.value.code == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"


# ---- what a client is told about a key and about TLS ------------------------------------------
class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"error": "Unauthorized"}'
        self.send_response(401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a) -> None:
        pass


@pytest.fixture
def plain_http():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _wait(ep: Endpoint) -> str:
    with pytest.raises(NotReady) as e:
        wait_ready(ep.session(trust_env=False), ep, 3.0, lambda _m: None)
    return str(e.value)


def test_a_rejected_key_is_not_told_to_set_a_key(plain_http: str) -> None:
    given = _wait(Endpoint.parse(f"http://{plain_http}", api_key="wrong"))
    assert "refused the API key given as --api-key" in given and "set --api-key" not in given
    none = _wait(Endpoint.parse(f"http://{plain_http}"))
    assert "requires an API key: set --api-key" in none


def test_https_against_plain_http_says_so(plain_http: str) -> None:
    import requests

    try:
        requests.get(f"https://{plain_http}/v1/models", timeout=5)
    except requests.RequestException as exc:
        why = cause(exc)
    assert "looks like plain HTTP" in why and "http://" in why
    assert why != "cannot connect"


def test_the_result_json_never_carries_the_api_key(tmp_path, monkeypatch) -> None:
    out = tmp_path / "c.json"
    key = "sk-bench-secret-42"
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.002, tokens_per_step=(2,))) as m:
        argv = ["--url", m.url, "--api-key", key, "--concurrency", "1", "--max-tokens", "4"]
        argv += ["--json", str(out), *FAST]
        monkeypatch.setattr(sys, "argv", ["bench_conc", *argv])
        assert bench_conc.main(argv) == 0
    text = out.read_text()
    assert key not in text
    assert json.loads(text)["command_line"][4:6] == ["--api-key", "***"]
