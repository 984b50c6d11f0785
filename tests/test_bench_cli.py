"""What a user typing the bench commands gets: clear usage errors, URLs as people write them,
output paths checked before the work, honest plots, and a simulator that says it is one.

Against the mock server (tests/fakes/mock_openai.py); each case failed on the code before.
"""

from __future__ import annotations

import json
import sys
import time

import matplotlib.figure
import pytest

from bench import bench_conc, bench_ctx, bench_interfere, chat_ttft_probe
from bench import quality_ref_dspark as gate
from bench.benchlib import EXIT_ERROR, EXIT_USAGE, endpoint
from tests.fakes.mock_openai import FAST_BENCH_FLAGS, MockConfig, MockServer

FAST = FAST_BENCH_FLAGS
MAINS = {
    "bench_conc": bench_conc.main,
    "bench_ctx": bench_ctx.main,
    "bench_interfere": bench_interfere.main,
    "chat_ttft_probe": chat_ttft_probe.main,
    "quality_ref_dspark": gate.main,
}


@pytest.fixture(autouse=True)
def _keep_switch_interval():
    old = sys.getswitchinterval()
    yield
    sys.setswitchinterval(old)


def usage_error(script: str, argv: list[str], capsys) -> str:
    """Run the script's main; it must stop with exit 2 and a one-line reason, no traceback."""
    with pytest.raises(SystemExit) as e:
        MAINS[script](argv)
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("script", "argv", "needle"),
    [
        ("bench_conc", ["--concurrency", "abc"], "--concurrency: needs comma-separated whole"),
        ("bench_conc", ["--concurrency", "1,0"], "--concurrency: needs whole numbers >= 1"),
        ("chat_ttft_probe", ["--turn-tokens", "xyz"], "--turn-tokens: must be a token count"),
        ("bench_ctx", ["--depths", "1k,zz"], "--depths: must be a token count"),
        ("bench_interfere", ["--lead-ms", "-100"], "--lead-ms: must be > 0, got -100"),
        ("bench_interfere", ["--prefill-tokens", "0"], "--prefill-tokens: must be at least 1"),
        ("quality_ref_dspark", ["--prompts", "/nope.json"], "cannot read /nope.json"),
        ("bench_ctx", ["--retries", "-1"], "--retries: must be >= 0, got -1"),
        ("bench_ctx", ["--warmups", "-2"], "--warmups: must be >= 0, got -2"),
        ("bench_conc", ["--prompt-tokens", "0"], "--prompt-tokens: must be >= 1, got 0"),
        ("bench_ctx", ["--guard-interval-ms", "0"], "--guard-interval-ms: must be >= 1"),
        ("bench_ctx", ["--runs", "0"], "--runs: must be >= 1"),
        ("bench_ctx", ["--timeout-s", "0"], "--timeout-s: must be > 0"),
        ("bench_ctx", ["--chat-template-kwargs", "[1]"], "must be a JSON object"),
        ("bench_ctx", ["--url", "ftp://h:8000"], "scheme ftp:// is not supported"),
        ("bench_ctx", ["--url", "http://h:99999"], "invalid port"),
        ("quality_ref_dspark", ["--max-tokens", "0"], "--max-tokens: must be >= 1"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(script, argv, needle, capsys):
    assert needle in usage_error(script, argv, capsys)


def test_a_malformed_reference_file_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "ref.json"
    bad.write_text('{"max_tokens": 8, "prompts": [{"name": "x"}]}')
    assert "needs {" in usage_error("quality_ref_dspark", ["--prompts", str(bad)], capsys)
    bad.write_text("{nope")
    assert "is not valid JSON" in usage_error("quality_ref_dspark", ["--prompts", str(bad)], capsys)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_output_paths_are_checked_before_any_request(flag, tmp_path, capsys):
    with MockServer(MockConfig(ttft_s=0.01, step_s=0.005)) as m:
        argv = ["--url", m.url, "--concurrency", "1", "--max-tokens", "8", *FAST]
        line = usage_error("bench_conc", [*argv, flag, "/nonexistent/dir/x.out"], capsys)
        assert m.records() == []  # nothing was measured and thrown away
    assert "directory /nonexistent/dir does not exist" in line
    assert "mkdir -p /nonexistent/dir" in line
    line = usage_error("bench_conc", ["--url", "http://127.0.0.1:9", flag, str(tmp_path)], capsys)
    assert "is a directory" in line


def test_gate_json_path_is_checked_before_any_request(capsys):
    line = usage_error("quality_ref_dspark", ["--json", "/nonexistent/dir/q.json"], capsys)
    assert "/nonexistent/dir does not exist" in line


# ---- the endpoint URL ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("h:8000", "http://h:8000"),
        ("h:8000/v1", "http://h:8000"),
        ("http://h/proxy/v1", "http://h/proxy"),
    ],
)
def test_urls_as_people_write_them(given, base):
    assert endpoint.normalize(given) == base


def test_a_v1_url_and_a_url_without_scheme_both_run(tmp_path):
    cfg = MockConfig(ttft_s=0.01, step_s=0.005, tokens_per_step=(2,))
    with MockServer(cfg) as m:
        for url in (m.url + "/v1", m.url.removeprefix("http://")):
            out = tmp_path / "c.json"
            argv = ["--url", url, "--concurrency", "1", "--max-tokens", "9", "--json", str(out)]
            assert bench_conc.main([*argv, *FAST]) == 0
            assert json.loads(out.read_text())["url"] == m.url


def test_unreachable_url_shows_progress_then_one_line_with_url_and_cause(capsys):
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        bench_ctx.main(["--url", "127.0.0.1:9/v1", "--ready-timeout-s", "2.5", *FAST])
    assert e.value.code == EXIT_ERROR and time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("waiting for http://127.0.0.1:9/v1/models (0 s of 2.5 s)")
    assert err[-1] == (
        "error: http://127.0.0.1:9/v1/models not ready after 2.5 s: "
        "connection refused (nothing listens there)"
    )
    assert not any("urllib3" in ln or "HTTPConnectionPool" in ln for ln in err)


def test_gate_takes_a_v1_url_and_names_a_missing_server_in_one_line(capsys):
    ref = json.loads(gate.DEFAULT_PROMPTS.read_text())
    right = {p["prompt"]: p["answer"] for p in ref["prompts"]}
    with MockServer(MockConfig(answers=right)) as m:
        assert gate.main(["--url", m.url + "/v1"]) == 0
    assert "5/5 passed" in capsys.readouterr().out
    # /v1/models that is not a model list (the old code printed `'data'`)
    with MockServer(MockConfig(answers=right, models_body={"object": "list"})) as m:
        assert gate.main(["--url", m.url, "--ready-timeout-s", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL endpoint:" in out and "/v1/models not ready after 1 s" in out
    assert "not with an OpenAI model list" in out and "'data'" not in out


def test_gate_says_when_the_endpoint_is_the_simulator(capsys, tmp_path):
    """The mock is not the simulator; a mock that marks itself like the twin is."""
    ref = json.loads(gate.DEFAULT_PROMPTS.read_text())
    right = {p["prompt"]: p["answer"] for p in ref["prompts"]}
    out_json = tmp_path / "q.json"
    with MockServer(MockConfig(answers=right)) as m:
        assert gate.main(["--url", m.url, "--json", str(out_json)]) == 0
    assert "SIMULATOR" not in capsys.readouterr().out
    assert json.loads(out_json.read_text())["simulator"] is False
    with MockServer(MockConfig(answers=right, owned_by="spark-twin-simulator")) as m:
        assert gate.main(["--url", m.url, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "endpoint: SPARK-TWIN SIMULATOR" in out and "says nothing about a model" in out
    doc = json.loads(out_json.read_text())
    assert doc["simulator"] is True and doc["endpoint"]["evidence"]


# ---- plots -----------------------------------------------------------------------------------
@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function saves (the real function runs; only the file is skipped)."""
    saved: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda self, *a, **k: saved.append(self)
    )
    return saved


def test_plots_start_every_y_axis_at_zero(figures, tmp_path):
    from bench.benchlib.report import plot

    plot(str(tmp_path / "p.png"), [1, 2, 4], [("tok/s", {"a": [54.0, 52.0, 51.0]})], "x", "t")
    (ax,) = figures[0].axes
    assert ax.get_ylim()[0] == 0  # a 54 -> 51 dip is 6%, not a cliff


def test_interfere_plot_draws_bars_not_a_line(figures, tmp_path):
    cfg = MockConfig(ttft_s=0.02, step_s=0.01, tokens_per_step=(2,), prefill_tok_s=20_000)
    with MockServer(cfg) as m:
        argv = ["--url", m.url, "--prefill-tokens", "2k", "--decode-tokens", "60"]
        argv += ["--lead-ms", "100", "--plot", str(tmp_path / "i.png"), *FAST]
        assert bench_interfere.main(argv) == 0
    (ax,) = figures[0].axes
    assert not ax.lines and len(ax.patches) == 2  # solo and under_prefill, side by side
    assert ax.get_ylim()[0] == 0
