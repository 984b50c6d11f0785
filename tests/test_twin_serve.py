"""The twin as a server: endpoints, SSE shape, metrics consistency, ground truth, faults."""

from __future__ import annotations

import json
import time

import pytest
import requests
import yaml

from pairctl.gate.check import DEFAULT_PROMPTS
from tests.support.twin import Twin, free_port, metric, metrics, stream, wait_http

MSG = [{"role": "user", "content": "Explain speculative decoding in two sentences."}]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twin")
    cfg = tmp / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "served-model-name": "dsv4-flash",
                "max-num-seqs": 12,
                "port": 1,
                "speculative-config": {"method": "dspark", "num_speculative_tokens": 5},
                "long-prefill-token-threshold": 4096,
                "no-such-key": 1,
            }
        )
    )
    port = free_port()
    t = Twin(
        [
            "deepseek-ai/DeepSeek-V4-Flash",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--twin-profile",
            "rehearsal",
            "--bogus-flag",
            "7",
            "--tokenizer-mode",
            "deepseek_v4",
            "--reasoning-parser",
            "deepseek_v4",
        ],
        tmp,
        "serve",
    )
    t.base = f"http://127.0.0.1:{port}"
    try:
        yield t
    finally:
        t.stop()


def test_stream_chat_and_metrics_within_10s_of_start(twin):
    wait_http(twin.base + "/health", timeout=10)
    t_sent = time.monotonic()
    events, times, headers = stream(
        twin.base,
        {
            "model": "dsv4-flash",
            "messages": MSG,
            "max_tokens": 24,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    text = requests.get(twin.base + "/metrics", timeout=5).text
    assert time.monotonic() - twin.t0 < 10.0
    assert headers["X-Spark-Twin"] == "simulator" and headers["X-Request-Id"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == [] and usage["completion_tokens"] == 24
    finals = [e for e in events[:-2] if e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in text
    assert 'model_name="dsv4-flash"' in text and 'engine="0"' in text
    log = twin.log()
    assert log.splitlines()[0].find("SPARK-TWIN SIMULATOR") >= 0
    # vLLM 0.33's own lines, in boot order (tests/test_twin_log.py checks their sources)
    order = [
        log.index(line)
        for line in (
            "(Worker pid=",
            "Loading model from scratch...",
            "torch.compile took",
            "Capturing CUDA graphs",
            "Graph capturing finished",
            "init engine (profile, create kv cache, warmup model) took",
            "Starting vLLM server on http://127.0.0.1:",
            "INFO:     Application startup complete.",
        )
    ]
    assert order == sorted(order), log
    assert "ignoring unknown flag --bogus-flag" in log and "no-such-key" in log
    # cold boot (no marker in TILELANG_CACHE_DIR): the first step pays the JIT stall, then
    # the marker is written so the next boot is warm
    assert "cold (no marker)" in log
    # the first token: thinking mode (the default) with --reasoning-parser: reasoning
    first_token = next(
        t
        for t, e in zip(times, events, strict=True)
        if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("reasoning")
    )
    assert first_token - t_sent >= 1.0  # rehearsal profile jit_stall_s
    assert (twin.log_path.parent / "tilelang" / "spark-twin-tilelang.marker").is_file()


def test_config_file_and_cli_precedence(twin):
    wait_http(twin.base + "/health")
    truth = requests.get(twin.base + "/twin/truth", timeout=5).json()
    assert truth["serve_args"]["max_num_seqs"] == 12  # from the file
    assert truth["serve_args"]["port"] != 1  # CLI beats file
    assert truth["derived"]["long_prefill_token_threshold"] == 4096
    models = requests.get(twin.base + "/v1/models", timeout=5).json()["data"]
    assert models[0]["id"] == "dsv4-flash" and models[0]["owned_by"] == "spark-twin-simulator"


def test_metric_deltas_match_what_was_served(twin):
    wait_http(twin.base + "/health")
    before = metrics(twin.base)
    served = []
    r = requests.post(
        twin.base + "/v1/chat/completions", timeout=60, json={"messages": MSG, "max_tokens": 40}
    ).json()
    served.append(r["usage"])
    ev, _, _ = stream(
        twin.base,
        {
            "prompt": "The quick brown fox",
            "max_tokens": 30,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
        path="/v1/completions",
    )
    served.append(ev[-2]["usage"])
    assert "".join(e["choices"][0]["text"] for e in ev[:-2])
    after = metrics(twin.base)

    def d(name, **lbl):
        return metric(after, name, **lbl) - metric(before, name, **lbl)

    gen = sum(u["completion_tokens"] for u in served)
    assert d("vllm:generation_tokens_total") == gen
    assert d("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in served)
    drafts = d("vllm:spec_decode_num_drafts_total")
    acc = d("vllm:spec_decode_num_accepted_tokens_total")
    # first token from prefill, then 1 + accepted per verify step; vLLM counts a step's
    # drafts as sampled, and a request's last step may be cut at max_tokens after that
    # (up to gamma = 5 tokens; bench/benchlib/conserve.py cites vllm/v1/core/sched/scheduler.py)
    assert gen <= len(served) + drafts + acc <= gen + 5 * len(served)
    assert d("vllm:spec_decode_num_draft_tokens_total") == 5 * drafts
    per_pos = [
        d("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(k)) for k in range(5)
    ]
    assert sum(per_pos) == acc and per_pos == sorted(per_pos, reverse=True)
    assert d("vllm:time_to_first_token_seconds_count") == 2
    assert d("vllm:e2e_request_latency_seconds_count") == 2
    assert d("vllm:prefix_cache_queries_total") == sum(u["prompt_tokens"] for u in served)


def test_single_stream_decode_rate_matches_truth(twin):
    wait_http(twin.base + "/health")
    truth = requests.get(twin.base + "/twin/truth", timeout=5).json()["derived"]
    before = metrics(twin.base)
    ev, times, headers = stream(
        twin.base,
        {
            "messages": MSG,
            "max_tokens": 150,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            # chat mode: every verify step streams content (a step that is only </think>
            # would send no chunk: vLLM's parser turns it into no delta)
            "chat_template_kwargs": {"thinking": False},
        },
    )
    after = metrics(twin.base)
    drafts, acc = (
        metric(after, n) - metric(before, n)
        for n in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total")
    )
    recs = {r["id"]: r for r in requests.get(twin.base + "/twin/requests", timeout=5).json()}
    rec = recs[headers["X-Request-Id"]]
    assert rec["received_ns"] < rec["first_token_ns"] < rec["finish_ns"] <= time.monotonic_ns()
    assert rec["completion_tokens"] == 150 and rec["tokenize_ms"] > 0
    # 1 prefill token + (1 + accepted) per verify step, the last step possibly cut at
    # max_tokens after its drafts were counted (as vLLM counts them; up to gamma = 5)
    emitted = 1 + rec["verify_steps"] + rec["accepted_tokens"]
    assert rec["completion_tokens"] <= emitted <= rec["completion_tokens"] + 5
    assert (rec["verify_steps"], rec["accepted_tokens"]) == (drafts, acc)
    # server side: the modelled timeline, exact up to host lag it could not absorb
    server_span = (rec["finish_ns"] - rec["first_token_ns"]) / 1e9
    assert rec["verify_steps"] / server_span == pytest.approx(truth["steps_per_s"], rel=0.02)
    # client side: what a benchmark sees (chunk arrival jitter on a loaded 2-core box)
    content = [
        (t, e)
        for t, e in zip(times, ev, strict=True)
        if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")
    ]
    steps = len(content) - 1  # chunks after the first token = verify steps
    span = content[-1][0] - content[0][0]
    assert steps == drafts
    assert steps / span == pytest.approx(truth["steps_per_s"], rel=0.08)
    tokens = ev[-2]["usage"]["completion_tokens"] - 1
    mal = 1 + acc / drafts
    assert tokens / span == pytest.approx(truth["steps_per_s"] * mal, rel=0.08)
    assert tokens / server_span == pytest.approx(truth["single_stream_decode_tok_s"], rel=0.05)


def test_tokenize_prompt_and_messages(twin):
    wait_http(twin.base + "/health")
    p = requests.post(twin.base + "/tokenize", json={"prompt": "hello world"}, timeout=5).json()
    assert p["count"] == len(p["tokens"]) > 0 and p["max_model_len"] > 0
    m = requests.post(twin.base + "/tokenize", json={"messages": MSG}, timeout=5).json()
    r = requests.post(
        twin.base + "/v1/chat/completions", timeout=60, json={"messages": MSG, "max_tokens": 2}
    ).json()
    assert m["count"] == r["usage"]["prompt_tokens"]
    ref = json.loads(DEFAULT_PROMPTS.read_text())["prompts"][0]
    r = requests.post(
        twin.base + "/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": ref["prompt"]}], "temperature": 0},
    ).json()
    assert r["choices"][0]["message"]["content"] == ref["answer"]
    assert r["choices"][0]["finish_reason"] == "stop"
    bad = requests.post(
        twin.base + "/v1/chat/completions", timeout=5, json={"model": "nope", "messages": MSG}
    )
    assert bad.status_code == 404 and bad.headers["X-Spark-Twin"] == "simulator"


def test_foreign_traffic_occupies_slots(twin):
    wait_http(twin.base + "/health")
    r = requests.post(
        twin.base + "/twin/foreign", json={"requests": 3, "seconds": 1.0}, timeout=5
    ).json()
    assert len(r["ids"]) == 3
    time.sleep(0.3)
    assert metric(metrics(twin.base), "vllm:num_requests_running") == 3
    t_end = time.monotonic() + 3.0
    while metric(metrics(twin.base), "vllm:num_requests_running") and time.monotonic() < t_end:
        time.sleep(0.1)
    assert metric(metrics(twin.base), "vllm:num_requests_running") == 0
    recs = [x for x in requests.get(twin.base + "/twin/requests", timeout=5).json() if x["foreign"]]
    assert len(recs) == 3 and all(x["completion_tokens"] > 0 for x in recs)


def test_64_concurrent_streams(twin):
    from concurrent.futures import ThreadPoolExecutor

    wait_http(twin.base + "/health")

    def one(i):
        ev, _, _ = stream(
            twin.base,
            {
                "messages": [{"role": "user", "content": f"n{i}"}],
                "max_tokens": 2,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
        return ev[-1] == "[DONE]" and ev[-2]["usage"]["completion_tokens"] == 2

    with ThreadPoolExecutor(64) as pool:
        assert all(pool.map(one, range(64)))
