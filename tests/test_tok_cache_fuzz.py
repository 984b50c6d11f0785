"""Fuzz: vLLM 0.33's DSV4 tokenizer with the cache gives the same ids on every turn.

>=10,000 random multi-turn conversations rendered by vLLM's own DSV4 chat encoding
(thinking/chat modes, tools and tool results, images, history edits and branches,
random Unicode, special-token look-alikes), advanced in an interleaved order so the cache
holds many conversations at once. Every turn is compared with the uncached tokenizer
(every 8th through vLLM's full ``encode``, the others through the same Rust backend
directly, to fit the time budget).
"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.needs_vllm

N_CONVERSATIONS = int(__import__("os").environ.get("TOK_FUZZ_N", "10000"))
ACTIVE = 12  # conversations in flight at once (interleaved in the cache)


def test_fuzzed_conversations_are_token_exact() -> None:
    from tests.support.tok_cache import (
        ConvFuzzer,
        fresh_cached_tokenizer,
        reference_tokenizer,
        render,
    )

    ref = reference_tokenizer()
    # A small budget so that eviction runs during the fuzz as well.
    tok = fresh_cached_tokenizer(budget_bytes=1 << 20, seed=1)
    enc = tok._dsv4_incremental_encoder
    backend = ref.backend_tokenizer
    fz = ConvFuzzer(seed=20261130)
    rng = random.Random(7)
    active: list[tuple[dict, int]] = []
    started = turns = 0
    while started < N_CONVERSATIONS or active:
        while started < N_CONVERSATIONS and len(active) < ACTIVE:
            active.append((fz.start(), 2 + (rng.random() < 0.3)))  # multi-turn: 2-3 turns
            started += 1
        i = rng.randrange(len(active))
        conv, left = active[i]
        prompt = render(ref, conv)
        if turns % 8 == 0:  # vLLM's own uncached call
            want = ref.encode(prompt, add_special_tokens=False)
        else:  # the same backend, without transformers' wrapper (4x cheaper on short text)
            want = backend.encode_batch_fast([prompt], add_special_tokens=False)[0].ids
        how = rng.random()
        if how < 0.7:
            got = tok.encode(prompt, add_special_tokens=False)
        elif how < 0.9:
            got = tok(prompt, add_special_tokens=rng.random() < 0.5)["input_ids"]
        else:
            got = tok.apply_chat_template(conv["messages"], tools=conv["tools"], **conv["kwargs"])
        turns += 1
        assert got == want, (
            f"turn {turns}: ids differ (len {len(got)} vs {len(want)}); prompt={prompt!r}"
        )
        if left <= 1:
            active.pop(i)
        else:
            fz.advance(conv)
            active[i] = (conv, left - 1)
    snap = enc.snapshot()
    assert turns >= N_CONVERSATIONS
    assert snap["enabled"] and snap["mismatches"] == 0
    # The cache really worked: most turns reused a prefix, and the budget evicted.
    assert snap["hits"] > 0.5 * snap["calls"], snap
    assert snap["reused_tokens"] > 0
    assert snap["evictions"] > 0, snap
    assert snap["bytes"] <= snap["budget_bytes"]
