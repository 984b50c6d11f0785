"""The twin takes what vLLM 0.33's OpenAI server takes for text, answers errors with vLLM's
bodies, and moves its counters when vLLM moves them (what the bench guard's token
conservation relies on). One fast twin for the HTTP cases; the counter timing on the engine's
virtual clock.
"""

from __future__ import annotations

import json

import pytest
import requests

from sim.twin import profile as profmod
from sim.twin.engine import Engine, EngineConfig, Request
from sim.twin.metrics import Metrics
from sim.twin.prefix_cache import PrefixCache, block_hashes
from sim.twin.sampling import AcceptanceDrawer, key_of
from tests.support.bench_twin import Twin

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    t = Twin(tmp_path_factory.mktemp("twin_shapes"), "--per-request-spec-decode-metrics", "summary")
    yield t
    t.stop()


def post(twin: Twin, path: str, body: dict) -> requests.Response:
    return requests.post(twin.url + path, json={"model": "dsv4-flash", **body}, timeout=30)


def sse(resp: requests.Response) -> list[dict]:
    assert resp.status_code == 200, resp.text
    out = []
    for line in resp.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_content_part_arrays_are_text_like_strings(twin):
    """vllm bench serve's openai-chat backend sends these; they used to crash the twin (500)."""
    text = "What is the chemical symbol of the element gold? Reply with only the symbol."
    parts = [{"type": "text", "text": text}]
    as_parts = post(
        twin, CHAT, {"messages": [{"role": "user", "content": parts}], "temperature": 0}
    )
    as_str = post(twin, CHAT, {"messages": [{"role": "user", "content": text}], "temperature": 0})
    assert as_parts.status_code == 200, as_parts.text
    a, b = as_parts.json(), as_str.json()
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["choices"][0]["message"]["content"] == "Au"  # the quality answer still matches
    two = [{"type": "text", "text": "one"}, {"type": "input_text", "text": "two"}]
    tok = requests.post(
        twin.url + "/tokenize", json={"messages": [{"role": "user", "content": two}]}, timeout=10
    ).json()
    joined = requests.post(
        twin.url + "/tokenize",
        json={"messages": [{"role": "user", "content": "one\n\ntwo"}]},
        timeout=10,
    ).json()
    assert tok["tokens"] == joined["tokens"]  # DSV4's encoder joins text blocks with "\n\n"


def test_max_completion_tokens_n_seed_stop_and_usage(twin):
    msgs = [{"role": "user", "content": "Write about rivers."}]
    r = post(twin, CHAT, {"messages": msgs, "max_completion_tokens": 7, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 7
    r = post(twin, CHAT, {"messages": msgs, "max_tokens": 6, "n": 3, "temperature": 0})
    doc = r.json()
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in doc["choices"]}) == 1  # greedy: identical
    assert doc["usage"]["completion_tokens"] == sum(
        rec["completion_tokens"] for i, rec in twin.records().items() if i.endswith(doc["id"])
    )
    seeded = [
        post(twin, CHAT, {"messages": msgs, "max_tokens": 12, "seed": 5, "temperature": 1}).json()[
            "choices"
        ][0]["message"]["content"]
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    full = post(twin, CHAT, {"messages": msgs, "max_tokens": 40, "ignore_eos": True, "seed": 1})
    word = full.json()["choices"][0]["message"]["content"].split()[3]
    cut = post(
        twin,
        CHAT,
        {"messages": msgs, "max_tokens": 40, "ignore_eos": True, "seed": 1, "stop": word},
    ).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and word not in cut["message"]["content"]
    r = post(twin, COMPLETIONS, {"prompt": "Once upon a time"})
    assert r.json()["usage"]["completion_tokens"] <= 16  # CompletionRequest's default max_tokens


def test_streams_carry_logprobs_continuous_usage_and_per_request_acceptance(twin):
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        "max_completion_tokens": 30,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "logprobs": True,
        "top_logprobs": 2,
    }
    events = sse(post(twin, CHAT, body))
    tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert all("usage" in e for e in events)
    per_event = [len(e["choices"][0]["logprobs"]["content"]) for e in tokens]
    assert sum(per_event) == 30 and max(per_event) > 1  # one entry per token, several per step
    first = tokens[0]["choices"][0]["logprobs"]["content"][0]
    assert len(first["top_logprobs"]) == 2 and first["top_logprobs"][0]["token"] == first["token"]
    last = events[-1]
    spec = last["metrics"]["speculative_decoding"]
    assert last["usage"]["completion_tokens"] == 30
    hist = spec["acceptance_histogram"]
    assert len(hist) == 6 and sum(hist) == spec["num_spec_steps"]
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + sum(j * c for j, c in enumerate(hist)) / sum(hist)
    )
    comp = post(twin, COMPLETIONS, {"prompt": "abc", "max_tokens": 5, "logprobs": 1}).json()
    lp = comp["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 5
    assert "".join(lp["tokens"]) == comp["choices"][0]["text"]


@pytest.mark.parametrize(
    ("path", "body", "kind", "param", "message"),
    [
        (CHAT, {"n": 0}, "BadRequestError", None, "n must be at least 1, got 0."),
        (CHAT, {"max_tokens": 0}, "BadRequestError", "max_tokens", "max_tokens must be at least"),
        (CHAT, {"n": "abc"}, "Bad Request", "body.n", "1 validation error:"),
        (
            CHAT,
            {"stream_options": {"include_usage": True}},
            "BadRequestError",
            "stream_options",
            "Stream options can only be defined when `stream=True`.",
        ),
        (
            CHAT,
            {"top_logprobs": 3},
            "BadRequestError",
            "top_logprobs",
            "when using `top_logprobs`, `logprobs` must be set to true.",
        ),
        (
            CHAT,
            {"logprobs": True, "top_logprobs": 21},
            "BadRequestError",
            "logprobs",
            "greater than max allowed: 20",
        ),
        (CHAT, {"stop": [""]}, "BadRequestError", None, "stop cannot contain an empty string."),
        (COMPLETIONS, {"logprobs": -3}, "BadRequestError", "logprobs", "must be a positive value"),
    ],
)
def test_errors_are_vllms_bodies(twin, path, body, kind, param, message):
    base = (
        {"prompt": "hi"}
        if path == COMPLETIONS
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    r = post(twin, path, {**base, **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == kind and err["param"] == param and err["code"] == 400
    assert message in err["message"]


def test_media_and_unknown_parts_are_refused_like_a_text_only_model(twin):
    img = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    r = post(twin, CHAT, {"messages": [{"role": "user", "content": img}]})
    assert r.status_code == 400 and "is not a multimodal model" in r.json()["error"]["message"]
    odd = [{"type": "hologram", "data": 1}]
    err = post(twin, CHAT, {"messages": [{"role": "user", "content": odd}]}).json()["error"]
    assert (
        err["param"] == "type"
        and "Unsupported chat content part type: 'hologram'" in (err["message"])
    )


# ---- counters on the engine's virtual clock -----------------------------------------------
PROF = profmod.load("rehearsal")


class VClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, secs: float) -> bool:
        self.t += max(secs, 0.0)
        return False


def engine(caching: bool = True) -> Engine:
    clock = VClock()
    cfg = EngineConfig(5, 24, 8192, 0, 1 << 20, False, 1_200_000, None)
    return Engine(
        PROF,
        cfg,
        Metrics("m", 5),
        PrefixCache(256, 10_000, enabled=caching),
        on_death=lambda why: None,
        clock=clock,
        sleep=clock.sleep,
    )


def request(eng: Engine, prompt: int, tokens: int, seed: int = 0) -> Request:
    ids = [(seed * 7919 + i) % 50000 + 100 for i in range(prompt)]
    key = key_of("t", seed)
    return Request(
        id=eng.next_id(),
        prompt_len=prompt,
        hashes=block_hashes(ids, 256),
        target_len=tokens,
        max_tokens=tokens,
        out_key=key,
        drawer=AcceptanceDrawer(PROF.cum_accept(5), "quasi", key),
        received_ns=0,
    )


def value(eng: Engine, name: str, **labels: str) -> float:
    return eng.m.registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels}) or 0


def test_counters_move_when_vllm_moves_them():
    eng = engine()
    r = request(eng, 20_000, 50)  # three prefill chunks of 8192
    eng.submit(r)
    eng.iterate(0)
    assert r.computed > 0 and r.first_token_ns is None
    # admitted: the lookup is counted; the prompt is not, until the first token
    assert value(eng, "vllm:prefix_cache_queries_total") == 20_000
    assert value(eng, "vllm:prompt_tokens_total") == 0
    while r.finish_reason is None:
        eng.iterate(0)
    assert value(eng, "vllm:prompt_tokens_total") == 20_000
    assert value(eng, "vllm:generation_tokens_total") == r.generated == 50
    assert value(eng, "vllm:request_success_total", finished_reason="length") == 1
    # a client abort: tokens it got are counted, no success, no prompt if before its first token
    a, b = request(eng, 300, 400, seed=1), request(eng, 30_000, 10, seed=2)
    eng.submit(a)
    eng.submit(b)
    for _ in range(3):
        eng.iterate(0)
    eng.cancel(a)
    eng.cancel(b)
    eng.iterate(0)
    assert a.finish_reason == b.finish_reason == "abort" and b.first_token_ns is None
    assert value(eng, "vllm:request_success_total", finished_reason="length") == 1
    assert value(eng, "vllm:request_success_total", finished_reason="abort") == 0
    assert value(eng, "vllm:prompt_tokens_total") == 20_000 + 300
    assert value(eng, "vllm:generation_tokens_total") == 50 + a.generated
    assert value(eng, "vllm:prefix_cache_queries_total") == 20_000 + 300 + 30_000


def test_no_lookups_counted_with_prefix_caching_off_and_drafts_counted_as_drawn():
    eng = engine(caching=False)
    r = request(eng, 100, 7)  # the last verify step is cut at max_tokens
    eng.submit(r)
    while r.finish_reason is None:
        eng.iterate(0)
    assert value(eng, "vllm:prefix_cache_queries_total") == 0
    accepted = value(eng, "vllm:spec_decode_num_accepted_tokens_total")
    drafts = value(eng, "vllm:spec_decode_num_drafts_total")
    assert accepted == r.accepted == sum(j * c for j, c in enumerate(r.spec_hist))
    assert 0 <= 1 + drafts + accepted - r.generated <= 5  # what the last step lost to max_tokens
