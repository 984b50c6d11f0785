"""The twin's pure parts: command line, --config, fault grammar, profile vs seed, prompts."""

from __future__ import annotations

import pytest
import yaml

from sim.twin import faults, lifecycle, profile, serve
from sim.twin.cli import UsageError, parse_serve_args
from sim.twin.prefix_cache import PrefixCache, block_hashes
from sim.twin.prompting import PromptEncoder, render_chat
from sim.twin.sampling import AcceptanceDrawer, natural_length, word

RECIPE_FLAGS = [
    "deepseek-ai/DeepSeek-V4-Flash",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--served-model-name",
    "dsv4",
    "--tensor-parallel-size",
    "2",
    "--distributed-executor-backend",
    "mp",
    "--nnodes",
    "2",
    "--node-rank",
    "1",
    "--master-addr",
    "10.0.0.1",
    "--master-port",
    "29501",
    "--headless",
    "--max-num-seqs",
    "24",
    "--max-num-batched-tokens",
    "8192",
    "--long-prefill-token-threshold",
    "4096",
    "--max-model-len",
    "262144",
    "--gpu-memory-utilization",
    "0.85",
    "--kv-cache-dtype",
    "fp8",
    "--speculative-config",
    '{"method":"dspark","num_speculative_tokens":5}',
    "--tokenizer-mode",
    "deepseek_v4",
    "--reasoning-parser",
    "deepseek_v4",
    "--tool-call-parser",
    "deepseek_v4",
    "--enable-auto-tool-choice",
    "--enable-prefix-caching",
    "--trust-remote-code",
]


def test_recipe_flags_parse_and_unknown_flags_are_kept_aside():
    a = parse_serve_args([*RECIPE_FLAGS, "--frobnicate", "3", "--new-thing=x"])
    assert (a.model, a.node_rank, a.headless, a.master_port) == (
        "deepseek-ai/DeepSeek-V4-Flash",
        1,
        True,
        29501,
    )
    assert (a.max_num_seqs, a.long_prefill_token_threshold, a.num_speculative_tokens) == (
        24,
        4096,
        5,
    )
    assert a.unknown == ["--frobnicate", "3", "--new-thing=x"]


def test_config_file_sits_between_cli_and_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": "from-file",
                "max-num-seqs": 16,
                "port": 9001,
                "enable-prefix-caching": False,
                "speculative-config": {"method": "dspark", "num_speculative_tokens": 3},
                "tensor_parallel_size": 2,
                "mystery": True,
            }
        )
    )
    a = parse_serve_args(["--config", str(cfg), "--max-num-seqs", "24"])
    assert a.model == "from-file" and a.max_num_seqs == 24 and a.port == 9001
    assert a.enable_prefix_caching is False and a.num_speculative_tokens == 3
    assert a.tensor_parallel_size == 2 and a.config_unknown == ["mystery"]
    assert parse_serve_args(["m"]).max_num_seqs is None  # default when neither sets it


@pytest.mark.parametrize(
    "argv, text",
    [
        ([], "no model"),
        (["m", "--nnodes", "4", "--node-rank", "4"], "out of range"),
        (["m", "--nnodes", "2", "--node-rank", "2"], "out of range"),
    ],
)
def test_bad_command_lines_say_what_to_fix(argv, text):
    with pytest.raises(UsageError, match=text):
        parse_serve_args(argv)


def test_config_errors_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(UsageError, match="mapping"):
        parse_serve_args(["m", "--config", str(bad)])
    with pytest.raises(UsageError, match="cannot read"):
        parse_serve_args(["m", "--config", str(tmp_path / "missing.yaml")])


def test_fault_grammar_per_rank():
    spec = "slow-boot:4:rank1; crash:graphs+2.5:rank0; foreign:3:10:30; stall:7:400; no-answers"
    r0, r1 = faults.parse(spec, 0), faults.parse(spec, 1)
    assert r0.slow_boot == 1.0 and r1.slow_boot == 4.0
    assert r0.crash_delay("graphs") == 2.5 and r1.crash_delay("graphs") is None
    assert r0.foreign == [(3, 10.0, 30.0)] and r1.foreign == []
    assert r0.stalls == {7: 400.0} and r1.stalls == {}
    assert r0.no_answers and r1.no_answers
    for bad in ("crash:nowhere", "slow-boot:x", "foreign:1:2", "crash:loading:rankX", "boom"):
        with pytest.raises(faults.FaultSpecError):
            faults.parse(bad, 0)


def test_draft_faults_parse_for_rank_0_only_and_say_what_is_wrong():
    from sim.twin.draft_faults import DraftFault

    spec = "draft-weights-dropped; draft-grammar; draft-first-collapse:0.1; draft-decay:0.5:2"
    r0, r1 = faults.parse(spec, 0), faults.parse(spec, 1)
    assert r0.draft == [
        DraftFault("draft-weights-dropped"),
        DraftFault("draft-grammar"),
        DraftFault("draft-first-collapse", 0.1),
        DraftFault("draft-decay", 0.5, 2),
    ]
    assert r1.draft == []  # the draft runs with rank 0's scheduler
    assert faults.parse("draft-first-collapse", 0).draft[0].factor == 0.05
    for bad, why in (
        ("draft-grammar:1", "wrong number of fields"),
        ("draft-decay:2", "FACTOR must be in"),
        ("draft-first-collapse:1.5", "P must be in"),
        ("draft-weights-dropped:x:y", "wrong number of fields"),
        ("draft-decay:-1", "must be >= 0"),
    ):
        with pytest.raises(faults.FaultSpecError, match=why):
            faults.parse(bad, 0)


def test_draft_faults_keep_each_position_at_most_the_one_before():
    from sim.twin.acceptance_model import _cum
    from sim.twin.draft_faults import DraftFault

    healthy = [0.95, 0.9, 0.86, 0.82, 0.8]
    for f in (DraftFault("draft-weights-dropped"), DraftFault("draft-grammar"),
              DraftFault("draft-first-collapse", 0.05)):  # fmt: skip
        got = _cum(f.apply(list(healthy)))
        assert all(0 <= b <= a <= 1 for a, b in zip([1.0, *got], got, strict=False)), f
    assert _cum(DraftFault("draft-grammar").apply(list(healthy)))[1:3] == pytest.approx(
        [0.224, 0.0]
    )


def test_default_profile_reproduces_the_seed_figures():
    p = profile.load(None)  # spark-pair.yaml
    d = profile.derived(
        p, gamma=5, fp8_head=False, max_num_seqs=24, max_num_batched_tokens=8192, lpt_threshold=4096
    )
    assert 67.0 <= d["decode_step_ms"] <= 69.0 and d["steps_per_s"] == pytest.approx(14.5, 0.02)
    assert 45 <= d["single_stream_decode_tok_s"] <= 65
    assert d["aggregate_decode_tok_s_by_batch"]["16"] == pytest.approx(108, rel=0.01)
    assert d["aggregate_decode_tok_s_by_batch"]["24"] == pytest.approx(131, rel=0.01)
    off = profile.derived(p, 5, False, 24, 8192, 0)
    assert d["decode_tok_s_beside_prefill"] / off["decode_tok_s_beside_prefill"] == pytest.approx(
        1.53, abs=0.03
    )
    fp8 = profile.derived(p, 5, True, 24, 8192, 4096)
    gain = fp8["single_stream_decode_tok_s"] / d["single_stream_decode_tok_s"] - 1
    assert 0.03 <= gain <= 0.05
    tok = d["aggregate_decode_tok_s_by_batch"]
    assert [tok[k] for k in ("1", "2", "4", "8", "16", "24")] == sorted(
        tok[k] for k in ("1", "2", "4", "8", "16", "24")
    )
    boot = p.section("boot")["cold"]
    assert 540 <= sum(boot.values()) <= 660  # "first boot takes ~10 min"
    assert 6 <= p.section("boot")["jit_stall_s"] <= 10


def test_rehearsal_profile_inherits_the_model_and_shortens_boot():
    base, fast = profile.load("spark-pair"), profile.load("rehearsal")
    assert fast.step_ms(7) == base.step_ms(7) and fast.accept_probs == base.accept_probs
    assert sum(fast.section("boot")["cold"].values()) < 3
    with pytest.raises(profile.ProfileError, match="not found"):
        profile.load("no-such-profile")


def test_acceptance_draws_are_prefix_closed_and_deterministic():
    cum = profile.load(None).cum_accept(5)
    a, b = AcceptanceDrawer(cum, "random", 42), AcceptanceDrawer(cum, "random", 42)
    draws = [a.draw() for _ in range(4000)]
    assert draws == [b.draw() for _ in range(4000)]
    for k, expect in enumerate(cum):  # P(accepted > k) = P(position k+1 accepted)
        assert sum(d > k for d in draws) / len(draws) == pytest.approx(expect, abs=0.03)
    assert word(5, 3) == word(5, 3) and natural_length(5, 10, 20) in range(10, 21)


def test_prefix_cache_block_chain():
    pc = PrefixCache(block_size=4, capacity_blocks=3)
    toks = list(range(20))
    pc.insert(block_hashes(toks, 4))
    assert len(pc) == 3  # LRU capacity
    assert pc.lookup(block_hashes(toks[:12], 4), 12) == 0  # the early blocks were evicted
    pc2 = PrefixCache(block_size=4, capacity_blocks=100)
    pc2.insert(block_hashes(toks[:12], 4))
    assert pc2.lookup(block_hashes(toks[:12] + [99, 98], 4), 14) == 12
    assert pc2.lookup(block_hashes(toks[:12], 4), 12) == 8  # last block always recomputed
    assert pc2.lookup(block_hashes([7] + toks[1:12], 4), 12) == 0  # chained hashes


def test_chat_render_and_real_tokenizer(monkeypatch):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    text = render_chat(msgs)
    assert text.startswith("<｜begin▁of▁sentence｜>") and text.endswith("<｜Assistant｜><think>")
    assert render_chat(msgs, thinking=False).endswith("</think>")
    assert len(render_chat(msgs)) > len(render_chat(msgs, reasoning_effort=None))
    with pytest.raises(ValueError):
        render_chat([{"role": "wizard", "content": "x"}])
    monkeypatch.delenv("VLLM_INCREMENTAL_ENCODE_CACHE", raising=False)
    enc = PromptEncoder()
    ids = enc.encode(text)
    assert ids[0] == 0 and enc.cached is False  # BOS is a real special token id
    assert "".join(enc.pieces('{"city": "Paris", "n": 3}')) == '{"city": "Paris", "n": 3}'
    monkeypatch.setenv("VLLM_INCREMENTAL_ENCODE_CACHE", "1")
    cached = PromptEncoder()  # the overlay is on pytest's pythonpath
    assert cached.cached and cached.encode(text) == ids


def test_tilelang_marker_makes_the_next_boot_warm(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    assert serve.warm_boot() is False  # cold: nothing cached yet
    lifecycle.write_marker()  # what the engine does after its first (stalled) step
    assert serve.warm_boot() is True
