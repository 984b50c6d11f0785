"""bench.chat_ttft_ab's summary (headline medians, ratio, tokenization share) and the driver's
usage errors; no server. The real-server run is tests/test_headline_real.py."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import chat_ttft_ab as ab


def _turn(k: int, ptok: int, off: float | None, on: float, same: bool = True) -> ab.Turn:
    def m(ttft: float | None) -> dict:
        return {"ttft_ms": ttft, "first_chunk_ms": 999.0, "prompt_tokens": ptok, "content": "x"}

    return ab.Turn(k, {"off": m(off), "on": m(on)}, {"off": "ok", "on": "ok"}, {}, same, 300)


def _args(tmp_path: Path, rows: list[dict]) -> argparse.Namespace:
    off = tmp_path / "offline.json"
    off.write_text(json.dumps({"rows": rows, "env": {"host": "vm"}}))
    return argparse.Namespace(headline_from=100_000, offline_json=off)


def test_headline_uses_only_later_turns_past_the_threshold(tmp_path: Path) -> None:
    run = ab.AB(["off", "on"])
    run.turns = [
        _turn(0, 101_000, 60_000.0, 60_000.0),  # the document: never in the headline
        _turn(1, 90_000, 5_000.0, 100.0),  # below --headline-from
        _turn(2, 100_000, 900.0, 400.0),
        _turn(3, 101_000, 1000.0, 500.0, same=False),
        _turn(4, 102_000, None, 450.0),  # no token text: first chunk (999 ms) stands in
    ]
    rows = [
        {"prompt_tokens": 100_500, "uncached_ms": 610.0, "cached_ms": 10.0},
        {"prompt_tokens": 150_000, "uncached_ms": 9e9, "cached_ms": 1.0},  # out of range
    ]
    s = ab.summarize(run, _args(tmp_path, rows))
    assert s["headline_turns"] == 3
    assert s["headline_prompt_tokens"] == [100_000, 102_000]
    assert s["median_ttft_ms"] == {"off": 999.0, "on": 450.0}
    assert s["ratio_A_over_B"] == pytest.approx(999.0 / 450.0)
    assert s["goal_met"] is True
    # (off - on) per 10k tokens: 50.0, 49.50..., 53.82...; the median is the middle one
    assert s["median_share_ms_per_10k"] == pytest.approx(50.0)
    assert s["offline_share"]["rows"] == 1
    assert s["offline_share"]["median_ms_per_10k"] == pytest.approx(600.0 * 10_000 / 100_500)
    assert s["different_output_turns"] == [3]


def test_goal_not_met_is_said(tmp_path: Path) -> None:
    run = ab.AB(["off", "on"])
    run.turns = [_turn(0, 1, 1.0, 1.0), _turn(1, 100_000, 530.0, 370.0)]
    s = ab.summarize(run, _args(tmp_path, []))
    assert s["goal_met"] is False
    assert s["offline_share"] is None


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--ports", "8101"], "two different ports"),
        (["--ports", "8101,8101"], "two different ports"),
        (["--engine-venv", "/nonexistent"], "make engine"),
    ],
)
def test_driver_usage_errors(argv: list[str], needle: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.headline_real", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert needle in out.stderr


def test_ab_labels_must_differ() -> None:
    with pytest.raises(SystemExit) as e:
        ab.parse_args(["--url-b", "127.0.0.1:9", "--labels", "on,on"])
    assert e.value.code == 2
