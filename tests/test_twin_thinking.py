"""The twin's DeepSeek-V4 thinking mode and reasoning split (sim/twin/thinking.py), checked
against vLLM 0.33's own code where it is importable (needs_vllm): the chat template kwargs
(vllm/entrypoints/openai/chat_completion/protocol.py), the encoder's mode
(vllm/tokenizers/deepseek_v4.py), the parser's start state and its split, streamed and not
(vllm/parser/deepseek_v4.py on vllm/parser/engine/parser_engine.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from sim.twin import thinking
from sim.twin.prompting import tokenizer_path

KWARGS = [
    {},
    {"thinking": True},
    {"thinking": False},
    {"enable_thinking": False},
    {"enable_thinking": True},
    {"thinking": False, "enable_thinking": True},
    {"reasoning_effort": "none"},
    {"thinking": True, "reasoning_effort": "none"},
    {"reasoning_effort": "max"},
]
EFFORTS = [None, "none", "low", "minimal", "medium", "high", "xhigh", "max"]
BODIES = [
    {"chat_template_kwargs": kw, **({"reasoning_effort": e} if e is not None else {})}
    for kw, e in itertools.product(KWARGS, EFFORTS)
]


def test_the_mode_follows_vllms_rules() -> None:
    assert thinking.mode({}) == thinking.Mode(True, "high")  # DSV4's default: thinking
    assert thinking.mode({"thinking": False}) == thinking.Mode(False, None)
    assert thinking.mode({"reasoning_effort": "none"}).thinking is False
    assert thinking.mode({"reasoning_effort": "medium"}) == thinking.Mode(True, "low")
    # a request's reasoning_effort injects enable_thinking unless the request set it
    on = thinking.template_kwargs(
        {"chat_template_kwargs": {"thinking": False}, "reasoning_effort": "low"}
    )
    assert on == {"thinking": False, "reasoning_effort": "low", "enable_thinking": True}
    assert thinking.mode(on).thinking is True
    for body in BODIES:
        kw = thinking.template_kwargs(body)
        assert thinking.parser_thinking(kw) == thinking.mode(kw).thinking, body


def test_the_split_holds_trailing_reasoning_space_and_leading_content_space() -> None:
    s = thinking.Split(True)
    assert s.delta(["Let", " me"], False) == ("Let me", None)
    assert s.delta(["  "], False) is None  # trailing whitespace of reasoning waits
    assert s.delta([" think"], False) == ("   think", None)
    assert s.delta([thinking.END_THINK], False) is None  # the terminal alone: no delta
    assert s.delta(["\n"], False) is None  # whitespace-only content waits for real content
    assert s.delta(["Au"], True) == (None, "\nAu")
    assert s.reasoning_tokens == 4
    assert thinking.Split(True).whole(["a", " b ", thinking.END_THINK, " c"]) == ("a b", " c")
    assert thinking.Split(True).whole(["a", " b"]) == ("a b", None)  # cut inside the thinking
    assert thinking.Split(False).whole([thinking.END_THINK, "x"]) == (None, "x")  # absorbed
    assert thinking.cut_pieces(["ab", "cd", "ef"], "abc") == ["ab", "c"]


# ---- against vLLM's own code --------------------------------------------------------------
@pytest.fixture(scope="module")
def vtok():
    """DSV4's tokenizer as vLLM holds it (get_cached_tokenizer: a parser per request is cheap)."""
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers.hf import get_cached_tokenizer

    return get_cached_tokenizer(PreTrainedTokenizerFast(tokenizer_file=tokenizer_path()))


def request(body: dict):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **body)


@pytest.mark.needs_vllm
def test_mode_agrees_with_vllms_kwargs_encoder_and_parser(vtok) -> None:
    from vllm.parser.deepseek_v4 import DeepSeekV4Parser
    from vllm.parser.engine.parser_engine_config import ParserState
    from vllm.tokenizers.deepseek_v4 import get_deepseek_v4_tokenizer

    enc = get_deepseek_v4_tokenizer(vtok)
    msgs = [{"role": "user", "content": "hi"}]
    for body in BODIES:
        kw = request(body).build_chat_params(None, "auto").chat_template_kwargs
        ours = thinking.template_kwargs(body)
        assert {k: kw[k] for k in ours} == ours, body
        assert not {"thinking", "enable_thinking", "reasoning_effort"} & (set(kw) - set(ours))
        prompt = enc.apply_chat_template(msgs, tokenize=False, **kw)
        m = thinking.mode(ours)
        assert prompt.endswith("<think>" if m.thinking else "</think>"), body
        assert ("Reasoning Effort:" in prompt) == (m.effort in ("high", "max")), body
        parser = DeepSeekV4Parser(vtok, None, chat_template_kwargs=kw)
        starts = parser.parser_engine_config.initial_state is ParserState.REASONING
        assert starts == thinking.parser_thinking(ours) == m.thinking, body


def reply_pieces(vtok, rng: random.Random) -> list[str]:
    """Single-token pieces: words, whitespace runs, a </think> somewhere (or none)."""
    vocab = [" the", " answer", ".", ",", " is", "Au", "\n", "  ", " ", "42", " Paris"]
    n = rng.randint(1, 24)
    out = [rng.choice(vocab) for _ in range(n)]
    if rng.random() < 0.8:
        out.insert(rng.randint(0, n), thinking.END_THINK)
    for p in out:
        assert len(vtok.encode(p, add_special_tokens=False)) == 1, p
    return out


@pytest.mark.needs_vllm
def test_the_split_agrees_with_vllms_parser_streamed_and_not(vtok) -> None:
    from vllm.parser.deepseek_v4 import DeepSeekV4Parser

    rng = random.Random(7)
    req = request({})
    for _ in range(300):
        start = rng.random() < 0.8
        kw = {} if start else {"thinking": False}
        pieces = reply_pieces(vtok, rng)
        ids = [vtok.encode(p, add_special_tokens=False)[0] for p in pieces]
        theirs = DeepSeekV4Parser(vtok, None, chat_template_kwargs=kw)
        r, c, _ = theirs.parse("".join(pieces), req, model_output_token_ids=ids)
        ours = thinking.Split(start)
        assert ours.whole(pieces) == (r, c), pieces
        assert ours.reasoning_tokens == theirs.count_reasoning_tokens(ids), pieces
        # streamed: the same pieces cut into outputs of 1-4 tokens (verify steps)
        theirs = DeepSeekV4Parser(vtok, None, chat_template_kwargs=kw)
        ours = thinking.Split(start)
        i = 0
        while i < len(pieces):
            k = rng.randint(1, 4)
            step, step_ids = pieces[i : i + k], ids[i : i + k]
            i += k
            done = i >= len(pieces)
            d = theirs.parse_delta("".join(step), step_ids, req, None, finished=done)
            want = None if d is None else (d.reasoning, d.content)
            assert ours.delta(step, done) == want, (pieces, step)
