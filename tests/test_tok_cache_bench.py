"""bench/kernels/bench_tokenizer_cache.py runs end to end on a tiny trace and judges it right."""

from __future__ import annotations

import json

import pytest

from bench.kernels.bench_tokenizer_cache import Row, main, summarize


def _row(turn: int, tokens: int, cached: float, new: float, miss: float | None = None) -> Row:
    limit = 1.1 * new + 1.0
    return Row(
        turn,
        tokens,
        tokens * 4,
        100,
        30,
        10.0 * turn,
        cached,
        new,
        limit,
        10.0 * turn / cached,
        cached <= limit,
        True,
        miss,
        None if miss is None else 100 * (miss / (10.0 * turn) - 1),
    )


def test_summary_maths() -> None:
    rows = [
        _row(1, 1000, 9.0, 9.0, miss=10.5),
        _row(2, 180_000, 3.0, 1.0),
        _row(3, 190_000, 3.0, 2.0, miss=29.0),
    ]
    s = summarize(rows)
    assert s["turns_over_limit"] == [2] and not s["all_within_limit"]
    assert s["worst_excess_ms"] == pytest.approx(3.0 - 2.1)
    assert s["tokens_near_186k"] == 190_000 and s["speedup_near_186k"] == pytest.approx(10.0)
    assert s["miss_overhead_pct_max"] == pytest.approx(5.0)


@pytest.mark.needs_vllm
def test_bench_runs_on_a_tiny_trace(tmp_path, monkeypatch) -> None:
    from bench.kernels import bench_tokenizer_cache as bench
    from tests.support.tok_cache import fresh_cached_tokenizer, reference_tokenizer

    def quick_load(repeats: int):
        # The session's tokenizers instead of two more loads from disk (~5-10 s); the
        # real loader ran for bench/results/tokenizer_cache/tokenizer_cache_bench.json.
        cold = fresh_cached_tokenizer()
        return reference_tokenizer(), [fresh_cached_tokenizer() for _ in range(repeats)], cold

    monkeypatch.setattr(bench, "_load", quick_load)
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(
        [
            "--max-tokens",
            "5000",
            "--new-tokens",
            "1500",
            "--repeats",
            "1",
            "--miss-every",
            "1",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--quiet",
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["schema_version"] == 1 and result["summary"]["all_exact"]
    assert len(result["rows"]) >= 2 and result["rows"][-1]["prompt_tokens"] >= 5000
    assert result["env"]["vllm"].startswith("0.33") and png.stat().st_size > 10_000
