# SPDX-License-Identifier: MIT
"""W8A8: fp8 weights *and* activations on fp8 tensor cores, fp32 accumulation, one launch.

Same layout as W8A16 (one program = BN weight rows x all M rows, W @ A^T), but the e4m3
weight tile goes to the tensor cores as it was loaded (no widening: on Hopper the
warpgroup MMA reads it straight from shared memory) and the activations are quantized
inside the kernel, in registers, from the bf16 tile each program loads:

* ``group=0``: one scale per row, from the row's amax over the whole K (a first pass over
  the activation rows, which every program reads from L2 anyway);
* ``group=128``: one scale per 1 x 128 block of a row, from the tile being multiplied
  (no first pass; the block's partial product is scaled into the fp32 accumulator).

``terms=2`` adds the rounding residual as a second e4m3 term (see ``quant.py``): twice the
MMA work, activations then as precise as bf16 to within a factor of two.
``promote`` is Triton's ``max_num_imprecise_acc``: on Hopper, fp8 MMA results are added to
an exact fp32 accumulator every ``promote`` elements of K; ``promote=0`` never promotes
(Triton's default on SM 9.0), which keeps the warpgroup MMAs asynchronous: ptxas
serializes them when the accumulator is read between them (its C7514 warning). The
arithmetic is reproduced bit for bit by ``quant.quantize_act`` and, offline, the torch
emulation ``emulate_w8a8`` (bench/kernels/fp8_tune/reference.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .configs import W8A8Config
from .quant import GROUP_K
from .w8a8_once import once_matmul
from .w8a16 import HAVE_TRITON, check_operands, launch_row_chunks

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .w8a16 import store_logits_t

    _TINY = tl.constexpr(2.0**-96)  # quant.TINY

    @triton.jit
    def _row_amax(a_ptrs, K, BK: tl.constexpr, BM: tl.constexpr):
        """amax over the whole K of BM activation rows (clamped rows: no mask needed)."""
        amax = tl.zeros((BM,), dtype=tl.float32)
        for _k in range(0, K, BK):
            a = tl.load(a_ptrs).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
            a_ptrs += BK
        return tl.maximum(amax, _TINY)

    @triton.jit
    def _quant_dot(wv, a, amax, acc, TERMS: tl.constexpr, BM: tl.constexpr, PROMOTE: tl.constexpr):
        """acc + W tile @ e4m3(a * qmax / amax)^T, in units of amax / 448."""
        if TERMS == 1:
            inv = tl.math.div_rn(tl.full([BM], 448.0, tl.float32), amax)
            qa = (a * inv[:, None]).to(tl.float8e4nv)
            acc = tl.dot(wv, tl.trans(qa), acc, max_num_imprecise_acc=PROMOTE)
        else:
            inv = tl.math.div_rn(tl.full([BM], 28.0, tl.float32), amax)
            x = a * inv[:, None]
            hi = x.to(tl.float8e4nv).to(tl.float32)
            hi16 = (hi * 16.0).to(tl.float8e4nv)
            lo = ((x - hi) * 16.0).to(tl.float8e4nv)
            acc = tl.dot(wv, tl.trans(hi16), acc, max_num_imprecise_acc=PROMOTE)
            acc = tl.dot(wv, tl.trans(lo), acc, max_num_imprecise_acc=PROMOTE)
        return acc

    @triton.jit
    def _w8a8_kernel(
        a_ptr,
        w_ptr,
        s_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_am,
        stride_wn,
        stride_ym,
        BN: tl.constexpr,
        BK: tl.constexpr,
        BM1: tl.constexpr,
        BM2: tl.constexpr,
        TERMS: tl.constexpr,
        GROUP: tl.constexpr,
        PROMOTE: tl.constexpr,
    ):
        """y[m, n] = s[n] * sum_k quant(a)[m, k] * w[n, k]; one program = BN rows x all M.

        Activation rows past M read row M-1 (never stored), W rows past N read row N-1.
        """
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        rows = tl.minimum(offs_n, N - 1)
        offs_k = tl.arange(0, BK)
        w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
        offs_m1 = tl.arange(0, BM1)
        a1_ptrs = a_ptr + tl.minimum(offs_m1, M - 1)[:, None] * stride_am + offs_k[None, :]
        acc1 = tl.zeros((BN, BM1), dtype=tl.float32)
        if not GROUP:
            amax1 = _row_amax(a1_ptrs, K, BK, BM1)
        if BM2 > 0:
            offs_m2 = BM1 + tl.arange(0, BM2)
            a2_ptrs = a_ptr + tl.minimum(offs_m2, M - 1)[:, None] * stride_am + offs_k[None, :]
            acc2 = tl.zeros((BN, BM2), dtype=tl.float32)
            if not GROUP:
                amax2 = _row_amax(a2_ptrs, K, BK, BM2)
        for _k in range(0, K, BK):
            wv = tl.load(w_ptrs)
            a1 = tl.load(a1_ptrs).to(tl.float32)
            if GROUP:
                g1 = tl.maximum(tl.max(tl.abs(a1), axis=1), _TINY)
                part = _quant_dot(wv, a1, g1, None, TERMS, BM1, PROMOTE)
                acc1 += part * tl.math.div_rn(g1, tl.full([BM1], 448.0, tl.float32))[None, :]
            else:
                acc1 = _quant_dot(wv, a1, amax1, acc1, TERMS, BM1, PROMOTE)
            a1_ptrs += BK
            if BM2 > 0:
                a2 = tl.load(a2_ptrs).to(tl.float32)
                if GROUP:
                    g2 = tl.maximum(tl.max(tl.abs(a2), axis=1), _TINY)
                    part2 = _quant_dot(wv, a2, g2, None, TERMS, BM2, PROMOTE)
                    acc2 += part2 * tl.math.div_rn(g2, tl.full([BM2], 448.0, tl.float32))[None, :]
                else:
                    acc2 = _quant_dot(wv, a2, amax2, acc2, TERMS, BM2, PROMOTE)
                a2_ptrs += BK
            w_ptrs += BK
        s = tl.load(s_ptr + rows)
        if not GROUP:
            acc1 = acc1 * tl.math.div_rn(amax1, tl.full([BM1], 448.0, tl.float32))[None, :]
        store_logits_t(y_ptr, acc1, s, offs_n, offs_m1, N, M, stride_ym)
        if BM2 > 0:
            if not GROUP:
                acc2 = acc2 * tl.math.div_rn(amax2, tl.full([BM2], 448.0, tl.float32))[None, :]
            store_logits_t(y_ptr, acc2, s, offs_n, offs_m2, N, M, stride_ym)


def w8a8_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: W8A8Config | None = None,
    out: torch.Tensor | None = None,
    compile_only: bool = False,
) -> Any:
    """``a`` [M, K] (bf16) @ (``q`` [N, K] e4m3 * ``scale`` [N]).T -> [M, N] in a's dtype.

    Activations are quantized inside the kernel (no separate launch); launches of at most
    256 rows; no host sync, no data-dependent allocation (CUDA-graph safe).
    """
    cfg = cfg or W8A8Config()
    check_operands(a, q, cfg.bk)
    if cfg.group and cfg.bk != GROUP_K:
        raise ValueError(f"per-block activation scales need BK={GROUP_K}, got BK={cfg.bk}")
    m, n = a.shape[0], q.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if cfg.once:
        return once_matmul(a, q, scale, cfg, out, compile_only)
    const = dict(TERMS=cfg.terms, GROUP=bool(cfg.group), PROMOTE=cfg.triton_promote())
    return launch_row_chunks(_w8a8_kernel, a, q, scale, out, cfg, const, compile_only)
