"""The run-17 probe (bench/kernels/fp8_head_mtile_probe.py) on the CPU: its M-tiled kernel
under Triton's interpreter, and the roofline bound the overlay README quotes from it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[1]
RUN17 = ROOT / "bench/results/fp8_head/fp8_head_run17_mtile.json"
RUN18 = ROOT / "tests/data/fp8_head/fp8_head_run18_allm.json"  # no document cites it

_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from bench.kernels.fp8_head_mtile_probe import mtile_matmul
    from dsv4_flash_overlays.fp8_head.quant import quantize_rowwise

    from bench.kernels.fp8_tune.reference import dequantize_rowwise
    torch.manual_seed(0)
    out = []
    for n, m, cfg in (
        (200, 5, dict(bm=16, bn=64, warps=4, bk=128, stages=3)),
        (200, 40, dict(bm=16, bn=64, warps=4, bk=128, stages=3)),
        (130, 70, dict(bm=64, bn=128, warps=8, bk=64, stages=4)),
    ):
        w = (torch.randn(n, 256) * 0.02).bfloat16()
        q, s = quantize_rowwise(w)
        a = torch.randn(m, 256).bfloat16()
        ref = a.double() @ dequantize_rowwise(q, s).double().t()
        y = mtile_matmul(a, q, s, cfg).double()
        out.append([n, m, float((y - ref).norm() / ref.norm()), bool(torch.isfinite(y).all())])
    print(json.dumps(out))
    """
)


def test_mtile_kernel_matches_float64_on_ragged_shapes_under_interpreter():
    require(importlib.util.find_spec("triton") is not None, "triton is not importable (vLLM's)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for n, m, rel, finite in json.loads(proc.stdout.strip().splitlines()[-1]):
        # what is left is the bf16 rounding of the stored logits (2^-9 relative per element);
        # a wrong M tile, weight row or scale would be O(1)
        assert finite and rel < 4e-3, (n, m, rel)


def test_all_m_probe_times_only_shapes_the_tuner_does_not_search():
    from bench.kernels.fp8_head_mtile_probe import all_m_grid
    from bench.kernels.fp8_tune.search import w8a16_grid

    for m in (56, 64, 72, 80, 96):
        extra = all_m_grid(m)
        assert extra and not set(extra) & set(w8a16_grid(m, "full")), m
        assert any(c.num_warps == 8 for c in extra) and any(c.bk == 64 for c in extra)


def test_run18_launch_errors_are_all_configs_the_smem_filter_rejects():
    """GPU evidence for configs.smem_need: in run 18 every launch that ran out of shared
    memory on the H200 is one the filter would never choose."""
    from dsv4_flash_overlays.fp8_head.configs import W8A16Config, fits

    run = json.loads(RUN18.read_text())
    limit = 232448  # the H200's shared_memory_per_block_optin
    failed = 0
    for row in run["rows"]:
        for c in row["configs"]:
            cfg = W8A16Config.from_dict(c["cfg"])
            if "error" in c:
                assert "shared memory" in c["error"], c
                assert not fits(cfg, row["m"], limit), c
                failed += 1
            else:
                assert c["shared"] <= limit
    assert failed > 0  # the run did exercise the limit


def test_roofline_bound_regimes():
    from bench.kernels.fp8_head_mtile_probe import bound_speedup

    ceil = {"copy_gbs": 4000.0, "bf16_tflops": 800.0}
    n, k = 129280, 4096
    # small M: memory-bound, about half the bf16 bytes -> about 2x
    assert 1.9 < bound_speedup(250.0, 1, n, k, ceil) * (2 * n * k / 4000e9 * 1e6) / 250.0 < 2.1
    # large M: compute-bound, bound falls as 1/M at a fixed bf16 time
    b1, b2 = bound_speedup(280.0, 200, n, k, ceil), bound_speedup(280.0, 400, n, k, ceil)
    assert b1 == pytest.approx(2 * b2, rel=1e-9)
    assert b1 == pytest.approx(280e-6 / (2 * 200 * n * k / 800e12))


def test_recorded_run17_bounds_follow_from_its_own_ceilings():
    """The README's roofline figures are what the recorded run's inputs give."""
    from bench.kernels.fp8_head_mtile_probe import bound_speedup

    run = json.loads(RUN17.read_text())
    k = 4096
    rows = {(r["n"], r["m"]): r for r in run["rows"]}
    for r in rows.values():
        assert r["bound"] == pytest.approx(
            bound_speedup(r["bf16_us"], r["m"], r["n"], k, run["ceilings"]), rel=1e-9
        )
    # the claim in mods/dsv4-flash-overlays/README.md: below 1.5x at M = 144, above at <= 128
    assert rows[(129280, 144)]["bound"] < 1.5 and rows[(64640, 144)]["bound"] < 1.5
    assert all(rows[(129280, m)]["bound"] > 1.5 for m in (48, 64, 80, 96, 112, 128))
