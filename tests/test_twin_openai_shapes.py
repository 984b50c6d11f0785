"""The twin takes what vLLM 0.33's OpenAI server takes for text, answers errors with vLLM's
bodies, splits thinking-mode replies as vLLM's DeepSeek-V4 reasoning parser does, and moves
its counters when vLLM moves them (what the bench guard's token conservation relies on). One
fast twin for the HTTP cases, one more with ``--reasoning-parser deepseek_v4`` (the recipe's)
for the reply shapes; the counter timing on the engine's virtual clock. The split itself is
checked against vLLM's own parser in tests/test_twin_thinking.py.
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
from tests.support.bench_twin import PROFILE, Twin

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    t = Twin(tmp_path_factory.mktemp("twin_shapes"), "--per-request-spec-decode-metrics", "summary")
    yield t
    t.stop()


# reasoning of 20-40 tokens: a 5-token max_tokens ends inside it, a 200-token one does not
THINKING_PROFILE = PROFILE + "output:\n  reasoning_min_tokens: 20\n  reasoning_max_tokens: 40\n"
GOLD = "What is the chemical symbol of the element gold? Reply with only the symbol."


@pytest.fixture(scope="module")
def parser_twin(tmp_path_factory):
    t = Twin(
        tmp_path_factory.mktemp("twin_reasoning"),
        "--reasoning-parser",
        "deepseek_v4",
        "--tokenizer-mode",
        "deepseek_v4",
        profile=THINKING_PROFILE,
    )
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
    chat_mode = {"temperature": 0, "chat_template_kwargs": {"thinking": False}}
    as_parts = post(twin, CHAT, {"messages": [{"role": "user", "content": parts}], **chat_mode})
    as_str = post(twin, CHAT, {"messages": [{"role": "user", "content": text}], **chat_mode})
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


def gold(twin: Twin, stream: bool = False, **extra) -> requests.Response:
    msgs = [{"role": "user", "content": GOLD}]
    body = {"messages": msgs, "temperature": 0, "max_tokens": 200, **extra}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return post(twin, CHAT, body)


def test_thinking_replies_put_the_thinking_in_reasoning_and_the_answer_in_content(parser_twin):
    """vllm/parser/deepseek_v4.py with vllm/entrypoints/openai/chat_completion/serving.py:
    thinking (the default) -> message.reasoning + message.content; chat mode -> content
    only; usage.completion_tokens_details.reasoning_tokens with a reasoning parser."""
    doc = gold(parser_twin).json()
    msg, use = doc["choices"][0]["message"], doc["usage"]
    assert msg["content"] == "Au" and doc["choices"][0]["finish_reason"] == "stop"
    assert msg["reasoning"] and "</think>" not in msg["reasoning"] + msg["content"]
    assert "reasoning_content" not in msg  # vLLM 0.33's ChatMessage field is `reasoning`
    # every token but </think> and the one-token answer was reasoning
    assert use["completion_tokens_details"] == {"reasoning_tokens": use["completion_tokens"] - 2}
    assert 20 <= use["completion_tokens"] - 2 <= 40
    for chat_mode in (
        {"chat_template_kwargs": {"thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "none"},
    ):
        off = gold(parser_twin, **chat_mode).json()
        assert off["choices"][0]["message"]["content"] == "Au", chat_mode
        assert off["choices"][0]["message"]["reasoning"] is None, chat_mode
        assert off["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
        assert off["usage"]["prompt_tokens"] < use["prompt_tokens"]  # no effort preamble
    # protocol.py build_chat_params: a reasoning_effort turns enable_thinking on, whatever
    # chat_template_kwargs.thinking says
    back_on = gold(parser_twin, chat_template_kwargs={"thinking": False}, reasoning_effort="high")
    assert back_on.json()["choices"][0]["message"]["reasoning"] == msg["reasoning"]


def test_max_tokens_inside_the_thinking_leaves_content_null(parser_twin):
    doc = gold(parser_twin, max_tokens=5).json()
    choice = doc["choices"][0]
    assert choice["message"]["content"] is None and choice["message"]["reasoning"]
    assert choice["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
    events = sse(gold(parser_twin, stream=True, max_tokens=5))
    deltas = [e["choices"][0]["delta"] for e in events[1:] if e["choices"]]
    assert all("content" not in d for d in deltas) and any(d.get("reasoning") for d in deltas)
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}


def test_streamed_deltas_split_as_the_full_reply(parser_twin):
    """Deltas carry `reasoning` or `content` (never </think>); the last tokens ride in the
    finish chunk; joined, they are the non-streamed reply."""
    full = gold(parser_twin).json()["choices"][0]["message"]
    events = sse(gold(parser_twin, stream=True))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:] if e["choices"]]
    assert all(d and set(d) <= {"reasoning", "content"} for d in deltas)
    assert "".join(d.get("reasoning", "") for d in deltas) == full["reasoning"]
    assert "".join(d.get("content", "") for d in deltas) == "Au"
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["delta"].get("content") == "Au"
    use = events[-1]["usage"]
    assert use["completion_tokens_details"] == {"reasoning_tokens": use["completion_tokens"] - 2}


def test_without_a_reasoning_parser_the_thinking_stays_in_content(twin):
    """No --reasoning-parser: nothing splits; </think> is not a special token of DSV4's
    vocabulary, so it stays in the text (and there is no completion_tokens_details)."""
    doc = gold(twin).json()
    msg = doc["choices"][0]["message"]
    assert msg["reasoning"] is None and doc["usage"]["completion_tokens_details"] is None
    thought, _, answer = msg["content"].partition("</think>")
    assert thought and answer == "Au"


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
