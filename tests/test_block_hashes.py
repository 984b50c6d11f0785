"""The block-hash cache (incremental-block-hashes overlay) is hash-exact.

Pure parts (the prefix comparison, the cache's reuse rule) run anywhere; the exactness
against vLLM's own hasher runs real vLLM 0.33's ``get_request_block_hasher`` and
``Request`` (needs_vllm) on random conversations: turns that extend the last one, edits in
the middle of the history, branches, other cache salts and LoRA adapters, prompts shorter
than a block, and vLLM 0.33's look-ahead hashing.
"""

from __future__ import annotations

import random

import pytest
from dsv4_flash_overlays import block_hashes, prefix_hashes
from dsv4_flash_overlays.prefix_hashes import BlockHashCache, common_prefix_len

# ------------------------------------------------------------------ pure: no vLLM needed


def test_common_prefix_len_matches_a_plain_loop() -> None:
    rng = random.Random(5)
    for _ in range(400):
        n = rng.randrange(0, 6000)
        a = [rng.randrange(4) for _ in range(n)]
        b = list(a[: rng.randrange(0, n + 1)]) + [
            rng.randrange(4) for _ in range(rng.randrange(50))
        ]
        want = 0
        while want < min(len(a), len(b)) and a[want] == b[want]:
            want += 1
        assert common_prefix_len(a, b) == want
        assert common_prefix_len(b, a) == want
        lim = rng.randrange(0, n + 1)
        assert common_prefix_len(a, b, lim) == min(want, lim)


def _chain(tokens: list[int], bs: int, lookahead: int = 0, salt: str = "") -> list[str]:
    """A stand-in chain with vLLM's dependence: parent, block tokens, look-ahead, salt."""
    out: list[str] = []
    parent = "none"
    i = 0
    while (i + 1) * bs + lookahead <= len(tokens):
        block = tokens[i * bs : (i + 1) * bs + lookahead]
        parent = f"{hash((parent, tuple(block), salt if i == 0 else ''))}"
        out.append(parent)
        i += 1
    return out


def test_reuse_stops_at_the_first_block_that_differs() -> None:
    cache = BlockHashCache(4, budget_bytes=1 << 20, verify_rate=0.0)
    old = list(range(40))
    cache.store("k", "r1", old, _chain(old, 4))
    new = old[:22] + [999] + old[23:] + [7, 7, 7]
    reused, lcp = cache.reusable("k", new)
    assert lcp == 22
    assert reused == _chain(old, 4)[:5]  # blocks 0..4 end at token 20 <= 22 < 24
    assert reused == _chain(new, 4)[:5]


def test_look_ahead_tokens_must_agree_too() -> None:
    cache = BlockHashCache(4, lookahead=3, budget_bytes=1 << 20, verify_rate=0.0)
    old = list(range(40))
    cache.store("k", "r1", old, _chain(old, 4, 3))
    new = old[:22] + [999]
    reused, _ = cache.reusable("k", new)
    # block i covers tokens up to 4 * (i + 1) + 3: blocks 0..3 (to 19) agree, block 4 (to 23) not
    assert len(reused) == 4
    assert reused == _chain(new + [0] * 8, 4, 3)[:4]


def test_another_key_is_never_reused() -> None:
    cache = BlockHashCache(4, budget_bytes=1 << 20, verify_rate=0.0)
    toks = list(range(64))
    cache.store(("lora-a", None), "r1", toks, _chain(toks, 4))
    assert cache.reusable(("lora-b", None), toks + [1]) == ([], 0)
    assert cache.reusable((None, "salt"), toks + [1]) == ([], 0)
    assert len(cache.reusable(("lora-a", None), toks + [1])[0]) == 16


def test_budget_evicts_the_oldest_and_zero_disables() -> None:
    per = prefix_hashes.BYTES_PER_TOKEN * 100 + prefix_hashes.BYTES_PER_HASH * 25 + 512
    cache = BlockHashCache(4, budget_bytes=2 * per, verify_rate=0.0)
    convs = [[c * 1000 + i for i in range(100)] for c in range(3)]
    for c, toks in enumerate(convs):
        cache.store("k", f"r{c}", toks, _chain(toks, 4))
    assert cache.reusable("k", convs[0] + [1])[0] == []  # evicted
    assert len(cache.reusable("k", convs[2] + [1])[0]) == 25
    assert not BlockHashCache(4, budget_bytes=0).enabled


def test_a_turn_supersedes_the_turn_it_extends() -> None:
    cache = BlockHashCache(4, budget_bytes=1 << 20, verify_rate=0.0)
    t1 = list(range(40))
    t2 = t1 + list(range(100, 120))
    cache.store("k", "r1", t1, _chain(t1, 4))
    cache.store("k", "r2", t2, _chain(t2, 4))
    assert cache.snapshot()["entries"] == 1


# ------------------------------------------------------------- real vLLM 0.33's hasher


def _vllm():
    pytest.importorskip("vllm", reason="real vLLM 0.33 is not importable")
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    kv_cache_utils.init_none_hash(sha256)
    return SamplingParams, sha256, kv_cache_utils, Request


def _request(Request, SamplingParams, rid, tokens, hasher, salt=None, lora=None):  # noqa: N803
    return Request(
        request_id=rid,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        cache_salt=salt,
        lora_request=lora,
        block_hasher=hasher,
    )


class _Conversations:
    """Random multi-turn token histories: extended, edited, branched, salted."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.live: list[tuple[list[int], str | None]] = []

    def _text(self, n: int) -> list[int]:
        return [self.rng.randrange(1, 129_000) for _ in range(n)]

    def next(self) -> tuple[list[int], str | None]:
        r = self.rng
        if not self.live or r.random() < 0.15:
            toks, salt = self._text(r.randrange(1, 3000)), r.choice([None, None, "tenant-a"])
        else:
            toks, salt = r.choice(self.live)
            x = r.random()
            if x < 0.6:  # the next turn
                toks = toks + self._text(r.randrange(1, 700))
            elif x < 0.75 and len(toks) > 10:  # an edit in the middle of the history
                i = r.randrange(len(toks))
                toks = toks[:i] + [r.randrange(1, 129_000)] + toks[i + 1 :]
            elif x < 0.85:  # a branch from an earlier point
                toks = toks[: r.randrange(len(toks) + 1)] + self._text(r.randrange(0, 300))
            elif x < 0.92:  # the same history under another cache salt
                toks = toks + self._text(r.randrange(1, 50))
                salt = "tenant-b" if salt is None else None
            else:  # the same prompt again (a retry), or a truncated one
                toks = toks[: r.randrange(len(toks) + 1)] if r.random() < 0.5 else toks
        self.live.append((toks, salt))
        if len(self.live) > 10:
            self.live.pop(r.randrange(len(self.live)))
        return toks, salt


@pytest.mark.needs_vllm
@pytest.mark.parametrize(("block_size", "lookahead"), [(16, 0), (128, 0), (16, 1), (32, 3)])
def test_hashes_equal_vllm_own_on_random_conversations(block_size: int, lookahead: int) -> None:
    SamplingParams, sha256, kv_cache_utils, Request = _vllm()  # noqa: N806
    kw = {"num_hash_lookahead_tokens": lookahead} if lookahead else {}
    plain = kv_cache_utils.get_request_block_hasher(block_size, sha256, **kw)
    cache = BlockHashCache(block_size, lookahead, budget_bytes=8 << 20, verify_rate=0.0, seed=1)
    cached = block_hashes.cached_hasher(
        kv_cache_utils.get_request_block_hasher(block_size, sha256, **kw), cache
    )
    conv = _Conversations(seed=block_size * 10 + lookahead)
    for i in range(300):
        toks, salt = conv.next()
        want = _request(Request, SamplingParams, f"p{i}", toks, plain, salt).block_hashes
        req = _request(Request, SamplingParams, f"c{i}", toks, cached, salt)
        assert req.block_hashes == want, (i, len(toks))
        # decoded tokens keep extending the chain exactly as vLLM's hasher does
        for t in conv._text(block_size + 2):
            req.append_output_token_ids(t)
        ref = _request(Request, SamplingParams, f"q{i}", toks, plain, salt)
        ref.append_output_token_ids(req.output_token_ids[:])
        assert req.block_hashes == ref.block_hashes
    assert cache.stats.hits > 100 and cache.stats.reused_blocks > 0


@pytest.mark.needs_vllm
def test_lora_and_multimodal_requests() -> None:
    SamplingParams, sha256, kv_cache_utils, Request = _vllm()  # noqa: N806
    from vllm.lora.request import LoRARequest

    plain = kv_cache_utils.get_request_block_hasher(16, sha256)
    cache = BlockHashCache(16, budget_bytes=8 << 20, verify_rate=0.0)
    cached = block_hashes.cached_hasher(kv_cache_utils.get_request_block_hasher(16, sha256), cache)
    toks = list(range(1, 400))
    a, b = LoRARequest("a", 1, "/tmp/a"), LoRARequest("b", 2, "/tmp/b")
    _request(Request, SamplingParams, "x", toks, cached, lora=a)
    for lora in (a, b, None):
        got = _request(Request, SamplingParams, "y", toks + [5, 6], cached, lora=lora)
        want = _request(Request, SamplingParams, "z", toks + [5, 6], plain, lora=lora)
        assert got.block_hashes == want.block_hashes
    assert block_hashes.context_key(got) is not None
    got.mm_features = ["an image"]
    assert block_hashes.context_key(got) is None  # never cached: its keys depend on more


@pytest.mark.needs_vllm
def test_a_wrong_cached_chain_is_caught_by_the_self_check() -> None:
    SamplingParams, sha256, kv_cache_utils, Request = _vllm()  # noqa: N806
    plain = kv_cache_utils.get_request_block_hasher(16, sha256)
    cache = BlockHashCache(16, budget_bytes=8 << 20, verify_rate=1.0)
    cached = block_hashes.cached_hasher(kv_cache_utils.get_request_block_hasher(16, sha256), cache)
    toks = list(range(1, 400))
    _request(Request, SamplingParams, "x", toks, cached)
    entry = next(iter(cache._lru.values()))
    entry.hashes[3] = b"\x00" * 32  # what a broken exactness argument would produce
    got = _request(Request, SamplingParams, "y", toks + [1], cached).block_hashes
    assert got == _request(Request, SamplingParams, "z", toks + [1], plain).block_hashes
    assert not cache.enabled and cache.stats.mismatches == 1


@pytest.mark.needs_vllm
def test_a_hint_from_the_handoff_skips_the_comparison_and_stays_exact() -> None:
    SamplingParams, sha256, kv_cache_utils, Request = _vllm()  # noqa: N806
    plain = kv_cache_utils.get_request_block_hasher(16, sha256)
    cache = BlockHashCache(16, budget_bytes=8 << 20, verify_rate=0.0)
    cached = block_hashes.cached_hasher(kv_cache_utils.get_request_block_hasher(16, sha256), cache)
    rng = random.Random(8)
    base_tokens = [rng.randrange(129_000) for _ in range(3000)]
    base = Request("b", base_tokens, SamplingParams(max_tokens=4), None, block_hasher=cached)
    for shared, hint_list in ((2900, base.prompt_token_ids), (2900, list(base_tokens))):
        new = base.prompt_token_ids[:shared] + [rng.randrange(129_000) for _ in range(200)]
        before = cache.stats.hinted
        prefix_hashes.BASE_HINTS.put("n", prefix_hashes.Hint("b", shared, id(hint_list)))
        got = Request("n", new, SamplingParams(max_tokens=4), None, block_hasher=cached)
        want = Request("m", list(new), SamplingParams(max_tokens=4), None, block_hasher=plain)
        assert got.block_hashes == want.block_hashes
        # only a hint naming the very list the cache holds is taken without comparing
        assert cache.stats.hinted - before == (1 if hint_list is base.prompt_token_ids else 0)
