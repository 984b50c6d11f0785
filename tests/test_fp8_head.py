"""fp8 draft head numerics and kernels on the CPU: quantizers, emulations, error bounds,
and both Triton kernels under Triton's interpreter.

The GPU timings are recorded in bench/results/fp8_head/ (H200 runs); tables, the
shared-memory filter and dispatch are in tests/test_fp8_configs.py, the tuner's rules in
tests/test_fp8_tune.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from dsv4_flash_overlays import fp8_head as F
from dsv4_flash_overlays.fp8_head import quant as Q

from bench.kernels.fp8_tune import reference as R
from tests.conftest import require

E4M3_FINITE = [
    c
    for c in range(256)
    if c not in (0x7F, 0xFF)  # 0x7F/0xFF are NaN in e4m3fn
]


def _grid() -> torch.Tensor:
    """Every finite e4m3 value, sorted, with its code (independent of torch's cast)."""
    vals = []
    for c in E4M3_FINITE:
        s, e, m = c >> 7, (c >> 3) & 0xF, c & 7
        v = (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals.append((-v if s else v, c))
    vals.sort()
    return torch.tensor([v for v, _ in vals], dtype=torch.float64), torch.tensor(
        [c for _, c in vals]
    )


def _rne_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Reference round-to-nearest-even onto the e4m3 grid, written from the format spec."""
    vals, codes = _grid()
    x = x.double().clamp(-448, 448)
    idx = torch.searchsorted(vals, x).clamp(1, len(vals) - 1)
    lo, hi = vals[idx - 1], vals[idx]
    dlo, dhi = x - lo, hi - x
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (codes[idx] % 2 == 0))
    return torch.where(pick_hi, hi, lo)


# ------------------------------------------------------------------------- quantization
def test_scales_map_row_max_to_448_and_zero_rows_are_safe():
    w = torch.randn(6, 64) * torch.tensor([1e-6, 1e-2, 1.0, 30.0, 1e4, 0.0])[:, None]
    q, s = F.quantize_rowwise(w.bfloat16())
    wf = w.bfloat16().float()
    assert torch.equal(s[:5], wf[:5].abs().amax(dim=1) / 448)
    assert s[5] == 1.0 and torch.all(q[5].float() == 0)
    assert torch.all(q.float().abs().amax(dim=1)[:5] == 448)  # the max element saturates
    assert torch.isfinite(q.float()).all()


def test_rounding_is_round_to_nearest_even_on_the_e4m3_grid():
    torch.manual_seed(1)
    w = torch.randn(4, 512) * 0.05
    w[0, :16] = 0.0
    q, s = F.quantize_rowwise(w)
    expect = _rne_e4m3(w.double() / s.double()[:, None])
    assert torch.equal(q.double(), expect)


def test_exact_midpoints_round_to_even_and_clamp_never_makes_nan():
    vals, _ = _grid()
    pos = vals[vals > 0]
    mids = (pos[:-1] + pos[1:]) / 2  # every midpoint between neighbours
    row = torch.cat([torch.tensor([448.0], dtype=torch.float64), mids])
    q, s = F.quantize_rowwise(row[None].float())
    assert s.item() == 1.0
    assert torch.equal(q.double()[0], _rne_e4m3(row.float().double()))
    # a row whose scaled max lands past 448 (only possible through the division's rounding,
    # so force it through a tiny scale) saturates instead of relying on the cast's overflow
    big = torch.tensor([[1.0, -1.0, 0.5]]) * 3e38
    q, s = F.quantize_rowwise(big)
    assert torch.isfinite(q.float()).all() and q.float().abs().max() == 448


def test_rounding_error_within_half_ulp_bound():
    torch.manual_seed(2)
    w = torch.randn(8, 1024) * torch.logspace(-4, 1, 8)[:, None]
    w[:, ::7] *= 1e-4  # subnormal-range elements
    q, s = F.quantize_rowwise(w)
    err = (w.double() - R.dequantize_rowwise(q, s)).abs()
    bound = torch.maximum(w.double().abs() * 2.0**-4, s.double()[:, None] * 2.0**-10)
    assert torch.all(err <= bound * (1 + 1e-6))
    ulp = R.e4m3_ulp(q).double() * s.double()[:, None]
    assert torch.all(err <= ulp / 2 * (1 + 1e-6))


def test_fp16_widening_is_exact_for_every_code():
    """The kernel widens e4m3 to fp16: every one of the 254 finite codes must survive."""
    values, codes = _grid()
    q = codes.to(torch.uint8).view(torch.float8_e4m3fn)
    assert torch.equal(q.to(torch.float16).double(), values)


# ------------------------------------------------------------------- activation quantization
def _ieee_scaled(a: torch.Tensor, qmax: float, group: int = 0) -> torch.Tensor:
    """a * (qmax / amax) with the division done in float64 then rounded (= IEEE fp32)."""
    af = a.float().abs()
    amax = (af.view(a.shape[0], -1, group) if group else af[:, None, :]).amax(-1)
    inv = (qmax / amax.double().clamp_min(Q.TINY)).float()
    return a.float() * inv.repeat_interleave(a.shape[1] // inv.shape[1], dim=1)


@pytest.mark.parametrize("group", [0, 128])
def test_one_term_activations_round_to_nearest_even_with_exact_scales(group):
    torch.manual_seed(4)
    a = (torch.randn(6, 256) * torch.logspace(-3, 2, 6)[:, None]).bfloat16()
    a[2] = 0.0
    aq = Q.quantize_act(a, terms=1, group=group)
    x = _ieee_scaled(a, 448.0, group)
    assert torch.equal(aq.hi.double(), _rne_e4m3(x))  # the kernel's division is IEEE (div_rn)
    assert aq.lo is None and torch.all(aq.hi[2].float() == 0) and torch.isfinite(aq.scale).all()
    blocks = aq.hi.float().abs().view(6, -1, group or 256).amax(-1)
    assert torch.all(blocks[[0, 1, 3, 4, 5]] == 448)  # each block's largest element saturates
    err = (a.double() - aq.dequantize()).abs()
    assert torch.all(err <= a.double().abs() * 2.0**-4 + 2.0**-10 * aq.scale.max())


def test_two_term_activations_are_bf16_precise_and_16hi_is_exact():
    torch.manual_seed(5)
    a = (torch.randn(8, 512) * torch.logspace(-2, 1, 8)[:, None]).bfloat16()
    aq = Q.quantize_act(a, terms=2)
    x = _ieee_scaled(a, 28.0)
    hi = _rne_e4m3(x)
    assert torch.equal(aq.hi.double(), hi * 16)  # 16 * hi: exact (|hi| <= 28, so <= 448)
    assert torch.equal(aq.lo.double(), _rne_e4m3(((x.double() - hi) * 16).float()))
    rel = (a.double() - aq.dequantize()).abs() / a.double().abs().clamp_min(1e-30)
    big = a.double().abs() > a.double().abs().amax(1, keepdim=True) * 2.0**-6
    assert rel[big].max() <= 2.0**-8 * (1 + 1e-6)  # vs 2^-4 for one term
    one = Q.quantize_act(a, terms=1)
    assert (a.double() - aq.dequantize()).norm() < (a.double() - one.dequantize()).norm() / 8


def test_emulations_match_float64_within_derived_tolerance():
    n, k = 333, 512  # ragged N
    torch.manual_seed(10)
    w = torch.randn(n, k) * 0.03
    q, s = F.quantize_rowwise(w)
    deq = R.dequantize_rowwise(q, s)
    for m in [*range(1, 17), 40]:
        a = torch.randn(m, k).bfloat16()
        ref = R.fp8_head_matmul_ref(a, q, s)
        got = R.emulate_kernel(a, q, s).double()
        absdot = a.double().abs() @ deq.abs().t()
        tol = ref.abs() * 2.0**-8 + absdot * k * 2.0**-24 + 1e-30
        assert torch.all((got - ref).abs() <= tol), m
        for terms, group in ((1, 0), (1, 128), (2, 0), (2, 128)):
            ref8 = R.w8a8_ref(a, q, s, terms, group)
            got8 = R.emulate_w8a8(a, q, s, terms, group).double()
            absdot8 = Q.quantize_act(a, terms, group).dequantize().abs() @ deq.abs().t()
            tol8 = ref8.abs() * 2.0**-8 + absdot8 * k * 2.0**-24 + 1e-30
            assert torch.all((got8 - ref8).abs() <= tol8), (m, terms, group)


PATHS = [
    F.ActNumerics(),
    F.ActNumerics(1, 0, 128),
    F.ActNumerics(1, 128, 128),
    F.ActNumerics(2, 0, 128),
    F.ActNumerics(2, 128, 32),
    F.ActNumerics(2, 0, 256),  # two terms per promotion (fuse=1, BK = 128)
    F.ActNumerics(2, 0, Q.NO_PROMOTE),  # the tensor core's accumulator over all of K
]


def test_accumulation_bound_grows_with_the_promotion_interval():
    torch.manual_seed(4)
    w = (torch.randn(300, 1024) * 0.04).bfloat16()
    q, s = F.quantize_rowwise(w)
    a = torch.randn(16, 1024).bfloat16()
    bound = R.ErrorBound(w, q, s)
    hard = [bound(a, F.ActNumerics(2, 0, p))[0] for p in (128, 256, Q.NO_PROMOTE)]
    assert torch.all(hard[0] < hard[1]) and torch.all(hard[1] < hard[2])
    # fp8 MMA truncation: 2^-13 per 32-deep step within a chunk, so the term is the sum of
    # |a||w| times steps * 2^-13 (plus fp32 adds): 4, 8 and 32 steps at K = 1024
    absdot = a.float().abs() @ (q.float() * s[:, None]).abs().t()
    extra = (hard[2] - hard[0]).double()
    assert torch.allclose(extra, absdot.double() * 28 * 2.0**-13, rtol=1e-3)


@pytest.mark.parametrize("num", PATHS, ids=lambda n: f"{n.name}-p{n.promote}")
def test_error_bound_covers_each_path_and_is_not_vacuous(num):
    torch.manual_seed(3)
    n, k = 500, 1024
    w = (torch.randn(n, k) * 0.04).bfloat16()
    q, s = F.quantize_rowwise(w)
    a = torch.randn(64, k).bfloat16()
    a[0, :7] = 30.0  # an outlier row: per-row activation scales must still be covered
    exact = a.double() @ w.double().t()
    if num.terms == 0:
        fp8 = R.emulate_kernel(a, q, s).double()
    else:
        fp8 = R.emulate_w8a8(a, q, s, num.terms, num.group).double()
    hard, stat = R.ErrorBound(w, q, s)(a, num)
    err = (fp8 - exact).abs()
    assert torch.all(err <= hard.double()) and torch.all(err <= stat.double())
    assert stat.median() < 20 * err.median()
    if num.terms == 1:  # one fp8 activation term: a second rounding error as large as W's
        w16 = (R.emulate_kernel(a, q, s).double() - exact).norm()
        assert err.norm() > 1.2 * w16


_INTERPRET_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from dsv4_flash_overlays import fp8_head as F
    from bench.kernels.fp8_tune import reference as R

    # Triton's interpreter rounds fp32 -> e4m3 without carrying into the exponent (7.84 ->
    # 4.0); the GPU's cvt.rn.satfinite rounds to nearest even and saturates, as torch does
    # after a clamp. Use that, so the interpreter computes what the hardware computes.
    orig = interp._convert_float
    def convert(data, src, dst, rounding):
        if dst == tl.float8e4nv and src == tl.float32:
            x = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.float32).copy())
            q = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return q.reshape(data.shape)
        return orig(data, src, dst, rounding)
    interp._convert_float = convert

    torch.manual_seed(0)
    k = 256
    W16, W8 = F.W8A16Config, F.W8A8Config
    cases = [(77 + 13 * m, m, W16(64, 64, 4, 2, pre_a=m % 2)) for m in (1, 2, 3, 5, 13, 16)]
    cases += [(130, m, W16(64, 128, 4, 2, pre_a=pre, single_tile=st, clamp_m=cl, pad_m=pad))
              for m, pre, st, cl, pad in ((40, 0, 0, 0, 0), (40, 1, 1, 0, 0), (40, 1, 0, 1, 0),
                                          (33, 1, 0, 0, 1), (37, 0, 0, 0, 1), (144, 1, 0, 0, 0),
                                          (300, 0, 1, 0, 1))]
    cases += [(131, m, W8(64, 128, 4, 2, terms=t, group=g, promote=32 if m == 17 else 128))
              for m in (1, 17, 40, 300) for t in (1, 2) for g in (0, 128)]
    cases += [(n, m, W16(bn, bk, 4, ns, tma=t))  # copy-engine loads: zero-filled past M, N
              for n, m, bn, bk, ns, t in ((200, 5, 64, 128, 3, 1), (130, 40, 64, 128, 3, 1),
                                          (77, 70, 128, 64, 4, 1), (131, 300, 64, 128, 2, 1),
                                          (130, 36, 64, 128, 3, 2), (77, 72, 128, 64, 4, 2),
                                          (131, 150, 64, 128, 2, 2))]
    cases += [(n, m, W8(bn, bk, nw, 2, terms=t, once=1, tma=tma, fuse=fu, single_tile=st,
                        promote=p))  # activations quantized once per launch (phase 1)
              for n, m, bn, bk, nw, t, tma, fu, st, p in (
                  (131, 1, 64, 128, 4, 2, 0, 1, 0, 128), (77, 20, 64, 128, 4, 2, 1, 1, 0, 128),
                  (130, 40, 128, 128, 4, 2, 1, 1, 1, 128), (131, 72, 128, 64, 8, 2, 0, 0, 0, 128),
                  (200, 150, 64, 128, 4, 1, 1, 0, 0, 0), (131, 300, 64, 128, 4, 2, 1, 1, 0, 128))]
    shipped = {}  # every distinct launch shape the shipped tables select
    for key in json.loads(F.CONFIG_PATH.read_text())["entries"]:
        name, n_full, _ = key.split("|")
        for m, cfg in F.lookup_table(name, int(n_full[2:]), 4096).items():
            if not isinstance(cfg, str):
                shape = (cfg.as_dict()["path"], cfg.tiles(m), cfg.bn, cfg.bk)
                shipped.setdefault(shape, (m, cfg))
    cases += [(200, m, cfg) for m, cfg in shipped.values()]
    out = []
    for n, m, cfg in cases:
        w = torch.randn(n, k) * 0.02
        w[2] = 0
        q, s = F.quantize_rowwise(w)
        a = torch.randn(m, k).bfloat16()
        if m > 2:
            a[1] = 0
        y = torch.full((m, n), float("nan"))
        if isinstance(cfg, W8):
            F.w8a8_matmul(a, q, s, cfg, out=y)
            ref = R.w8a8_ref(a, q, s, cfg.terms, cfg.group)
        else:
            F.w8a16_matmul(a, q, s, cfg, out=y)
            ref = R.fp8_head_matmul_ref(a, q, s)
        rel = float((y.double() - ref).norm() / ref.norm().clamp_min(1e-300))
        out.append([n, m, cfg.as_dict(), int(torch.isnan(y).sum()), rel])
    print(json.dumps({"rows": out, "shipped": len(shipped)}))
    """
)


def test_both_triton_kernels_under_interpreter_ragged_shapes():
    require(importlib.util.find_spec("triton") is not None, "triton is not importable (vLLM's)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _INTERPRET_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = res["rows"]
    assert res["shipped"] >= 5 and len(rows) == 6 + 7 + 16 + 7 + 6 + res["shipped"]
    assert sum(r[2].get("once", 0) for r in rows) > 6  # the shipped table uses it too
    for n, m, cfg, unwritten, rel in rows:
        assert unwritten == 0, (n, m, cfg)
        # fp32 output vs float64 of the exact operands the kernel quantized: what is left is
        # fp32 accumulation only (a wrong tile, row or scale would be O(1))
        assert rel < 1e-6, (n, m, cfg, rel)


# --------------------------------------------------------------------------------- tiles
def test_m_tiles_cover_m_with_little_padding():
    for m, single in ((m, s) for m in range(1, 257) for s in (False, True)):
        bm1, bm2 = F.m_tiles(m, single)
        assert bm1 + bm2 >= m and bm1 >= 16 and (bm2 == 0 or bm2 >= 16)
        assert bm1 & (bm1 - 1) == 0 and bm2 & (bm2 - 1) == 0
        assert bm1 + bm2 <= max(16, 2 ** (m - 1).bit_length())
    assert F.m_tiles(144) == (128, 16) and F.m_tiles(120) == (128, 0)
    assert F.m_tiles(40) == (32, 16) and F.m_tiles(5) == (16, 0)
    padded = F.W8A16Config(pad_m=1)
    assert padded.tiles(33) == padded.tiles(48) == (32, 16) and padded.tiles(1) == (16, 0)


def test_eval_script_reports_every_path_on_a_real_safetensors_shard(tmp_path):
    require(importlib.util.find_spec("safetensors") is not None, "safetensors not importable")
    import safetensors.torch as safetensors

    from bench.kernels import eval_fp8_head

    w = (torch.randn(300, 256) * 0.04).bfloat16()
    path = tmp_path / "head.safetensors"
    safetensors.save_file({"head.weight": w}, str(path))
    args = eval_fp8_head.parse_args(
        ["--weights", str(path), "--key", "head.weight", "--rows", "120", "--chunk", "60"]
        + ["--device", "cpu", "--f64-rows", "60"]
    )
    res = eval_fp8_head.evaluate(args)
    assert res["n"] == 300 and res["k"] == 256 and res["source"].endswith(":head.weight")
    paths = res["paths"]
    assert set(paths) == {
        "w8a16",
        "w8a8-t1-row",
        "w8a8-t1-g128",
        "w8a8-t2-row",
        "w8a8-t2-g128",
        "w8a8-t2-row-p256",  # both terms per promotion (fuse=1)
        "w8a8-t1-row-fastacc",  # no promotion
        "w8a8-t2-row-fastacc",
        "scaled_mm",
    }
    for fam, r in paths.items():
        assert r["all_within_hard_bound"] and r["argmax_agreement"] > 0.9, fam
        assert 1e-3 < r["rel_logit_err_vs_f64_of_bf16_head"] < 0.06, fam
    one, two = paths["w8a8-t1-row"], paths["w8a8-t2-row"]
    base = paths["w8a16"]["rel_logit_err_vs_f64_of_bf16_head"]
    assert one["rel_logit_err_vs_f64_of_bf16_head"] > 1.2 * base  # fp8 activations add error
    assert abs(two["rel_logit_err_vs_f64_of_bf16_head"] - base) < 0.05 * base  # two terms don't
