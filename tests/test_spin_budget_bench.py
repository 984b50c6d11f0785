"""bench/spin_budget_pair.py without booting a pair: the /proc sampling it adds up, the
overlay check that makes its A/B valid, and the summary it prints.

The /proc tree is written here (tmp_path), so the parsing is tested on the awkward cases a
real /proc has (a comm with spaces and a ')', vLLM's title longer than the comm, a process
that starts mid-phase) without depending on what runs on the box.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import spin_budget_pair as sbp
from bench.benchlib import proccpu

TICK = proccpu.TICK_S


def _proc(root: Path, pid: int, ppid: int, comm: str, ticks: tuple[int, int], title: str = ""):
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # Fields 3.. after the comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime ...
    rest = f"S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {ticks[0]} {ticks[1]} 0 0 20 0 1 0 0"
    (d / "stat").write_text(f"{pid} ({comm}) {rest}\n")
    (d / "cmdline").write_bytes((title or comm).encode() + b"\0")


def test_a_tree_is_its_root_and_every_descendant_with_their_cpu(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 1, "vllm", (100, 50))
    _proc(tmp_path, 11, 10, "VLLM::EngineCor", (300, 0), "VLLM::EngineCore" + " " * 20)
    _proc(tmp_path, 12, 11, "VLLM::Worker_TP", (40, 10), "VLLM::Worker_TP0")
    _proc(tmp_path, 13, 1, "other (x) y", (999, 999))  # not ours: a sibling of the root
    _proc(tmp_path, 14, 13, "child of other", (5, 5))
    (tmp_path / "self").mkdir()  # non-numeric entries are skipped
    tree = proccpu.tree(10, tmp_path)
    assert sorted(tree) == [10, 11, 12]
    assert tree[11].name == "VLLM::EngineCore"  # the title, not the 15-character comm
    assert tree[12].name == "VLLM::Worker_TP0"
    assert tree[10].cpu_s == pytest.approx(150 * TICK)
    other = proccpu.tree(13, tmp_path)
    assert other[13].name == "other (x) y" and sorted(other) == [13, 14]


def test_delta_counts_a_new_process_from_zero_and_sums_by_name(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 1, "vllm", (100, 0))
    _proc(tmp_path, 11, 10, "VLLM::Worker_TP", (100, 0), "VLLM::Worker_TP0")
    before = proccpu.tree(10, tmp_path)
    _proc(tmp_path, 10, 1, "vllm", (150, 0))
    _proc(tmp_path, 11, 10, "VLLM::Worker_TP", (400, 100), "VLLM::Worker_TP0")
    _proc(tmp_path, 12, 10, "VLLM::Worker_TP", (20, 0), "VLLM::Worker_TP0")  # started since
    d = proccpu.delta(before, proccpu.tree(10, tmp_path))
    assert d[10].cpu_s == pytest.approx(50 * TICK, abs=1e-3)
    assert d[11].cpu_s == pytest.approx(400 * TICK, abs=1e-3)
    assert d[12].cpu_s == pytest.approx(20 * TICK, abs=1e-3)
    assert proccpu.by_name(d) == {
        "VLLM::Worker_TP0": pytest.approx(420 * TICK, abs=2e-3),
        "vllm": pytest.approx(50 * TICK, abs=1e-3),
    }
    assert proccpu.total_s(d) == pytest.approx(470 * TICK, abs=3e-3)


def test_the_real_proc_has_this_process() -> None:
    me = proccpu.tree(os.getpid())
    assert os.getpid() in me and me[os.getpid()].cpu_s > 0


# ------------------------------------------------------------------ the overlay check
ACTIVE = (
    "(EngineCore pid=5) INFO [__init__.py:69] dsv4-flash-overlays: spin-budget active "
    "(stack cpu, vLLM 0.32.0, pid 5): readers spin 2 ms after a message, then sleep"
)
REFUSED = "(VllmWorker-1 pid=7) WARNING dsv4-flash-overlays: spin-budget not applied (stack cpu"


def test_the_vllm_variant_must_log_no_spin_budget_line() -> None:
    assert sbp.check_overlay("vllm", [[], []]) == ""
    assert "the vllm pair logged" in sbp.check_overlay("vllm", [[ACTIVE], []])


def test_the_budget_variant_needs_an_active_line_on_each_node_and_no_refusal() -> None:
    assert sbp.check_overlay("budget", [[ACTIVE, ACTIVE], [ACTIVE]]) == ""
    assert sbp.check_overlay("budget", [[ACTIVE], []]).startswith("node 1:")
    assert sbp.check_overlay("budget", [[ACTIVE], [ACTIVE, REFUSED]]).startswith("node 1:")


# ------------------------------------------------------------------------ the summary
def _round(
    variant: str, idle: list[float], cpu_ms: list[float], tok_s: list[float], text="a", gap=40.0
):
    reqs = [{"decode_tok_s": t, "text_sha256_16": text, "itl_max_ms": gap} for t in tok_s]
    return {
        "variant": variant,
        "idle": {"pct_of_one_core": idle, "pair_pct_of_one_core": sum(idle)},
        "decode": {
            "cpu_ms_per_token": cpu_ms,
            "requests": reqs,
            "decode_tok_s_median": sorted(tok_s)[len(tok_s) // 2],
        },
    }


def test_the_summary_takes_medians_over_rounds_and_requests_and_judges_the_goals() -> None:
    rounds = [
        _round("vllm", [2.0, 1.0], [11.0, 3.0], [70, 72, 74]),
        _round("budget", [1.0, 1.0], [5.0, 4.0], [71, 73, 75]),
        _round("vllm", [4.0, 1.0], [13.0, 3.0], [60, 62, 64]),
        _round("budget", [2.0, 1.5], [4.0, 4.0], [61, 63, 65]),
    ]
    s = sbp.summarize(rounds, 2.0)
    assert s["vllm"]["rounds"] == 2 and s["budget"]["rounds"] == 2
    assert s["vllm"]["idle_pct_node"] == [3.0, 1.0]
    assert s["vllm"]["idle_pct_pair"] == pytest.approx(4.0)
    assert s["budget"]["cpu_ms_per_token_node"] == [4.5, 4.0]
    assert s["vllm"]["decode_tok_s_median"] == pytest.approx(67.0)  # over all 6 requests
    assert s["budget"]["decode_tok_s_median"] == pytest.approx(68.0)
    assert s["goals"] == {"idle_under_5pct_of_a_core": True, "decode_not_slower": True}
    assert s["same_text"] is True


def test_a_slower_or_busier_budget_fails_its_goals() -> None:
    rounds = [
        _round("vllm", [1.0, 1.0], [11.0, 3.0], [70, 72]),
        _round("budget", [4.0, 3.0], [5.0, 4.0], [60, 62], text="b", gap=5012.0),
    ]
    s = sbp.summarize(rounds, 2.0)
    # the longest gap between two streamed chunks: where a lost ping would show (5 s recheck)
    assert (s["vllm"]["itl_max_ms"], s["budget"]["itl_max_ms"]) == (40.0, 5012.0)
    assert s["goals"] == {"idle_under_5pct_of_a_core": False, "decode_not_slower": False}
    assert s["same_text"] is False
