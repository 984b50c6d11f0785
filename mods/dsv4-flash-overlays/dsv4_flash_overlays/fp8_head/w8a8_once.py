# SPDX-License-Identifier: MIT
"""W8A8 with the activations quantized once per launch (``W8A8Config(once=1)``).

Why: the plain W8A8 kernel (``w8a8.py``) quantizes all M x K activations in every program,
N / BN times per launch, and lost to W8A16 on an H200 for that reason (lab notes, run 12).
Here one launch does two phases:

1. **quantize, once.** Programs take row tickets from a global counter (``atomic_add``)
   until none are left; a ticket quantizes one activation row (per-row scale, one or two
   e4m3 terms, exactly ``quant.quantize_act``) into a scratch buffer and counts the row as
   done (release). Rows past M are written as zeros, so phase 2 needs no masks.
2. **multiply.** Every program waits until all rows are done (acquire), then multiplies
   its BN weight rows by the quantized rows on the fp8 tensor cores: weight and activation
   tiles both go from shared memory to the MMA as loaded, nothing is widened or quantized
   in the loop.

No program waits before it has found the tickets all taken, and a taken ticket is
finished by a program that is running and never waits first, so the launch cannot
deadlock whatever order the GPU schedules programs in (Triton's interpreter runs them one
after another: program 0 then takes every ticket). The counters are zeroed by a memset
before each launch (captured in the CUDA graph with it). ``tma=1`` loads the weight tiles
with the copy engine (Hopper); the activation tiles, written in this launch, are always
read with ordinary loads after the acquire.
"""

from __future__ import annotations

from typing import Any

import torch

from .configs import MAX_M_PER_LAUNCH, W8A8Config
from .quant import FP8
from .w8a16 import HAVE_TRITON, TensorDescriptor

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .w8a16 import store_logits_t

    _TINY = tl.constexpr(2.0**-96)  # quant.TINY

    @triton.jit
    def _quantize_row(
        a_ptr, qa_ptr, sa_ptr, row, M, K, rows_p, stride_am, KP: tl.constexpr, TERMS: tl.constexpr
    ):
        """Row ``row`` of the activations -> e4m3 term(s) in qa [TERMS, rows_p, K] and its
        scale amax / 448 in sa; a row >= M becomes zeros (amax floored at TINY)."""
        offs = tl.arange(0, KP)
        ok = (offs < K) & (row < M)
        a = tl.load(a_ptr + row * stride_am + offs[None, :], mask=ok[None, :], other=0.0)
        a = a.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(a), axis=1), _TINY)
        dst = qa_ptr + row * K + offs[None, :]
        k_ok = offs[None, :] < K
        if TERMS == 1:
            inv = tl.math.div_rn(tl.full([1], 448.0, tl.float32), amax)
            tl.store(dst, (a * inv[:, None]).to(tl.float8e4nv), mask=k_ok)
        else:
            inv = tl.math.div_rn(tl.full([1], 28.0, tl.float32), amax)
            x = a * inv[:, None]
            hi = x.to(tl.float8e4nv).to(tl.float32)
            tl.store(dst, (hi * 16.0).to(tl.float8e4nv), mask=k_ok)
            tl.store(dst + rows_p * K, ((x - hi) * 16.0).to(tl.float8e4nv), mask=k_ok)
        sc = tl.math.div_rn(amax, tl.full([1], 448.0, tl.float32))
        tl.store(sa_ptr + row + tl.arange(0, 1), sc)

    @triton.jit
    def _terms_dot(
        wv, a_ptrs, lo_off, acc, TERMS: tl.constexpr, PROMOTE: tl.constexpr, FUSE: tl.constexpr
    ):
        """acc + W tile @ (16 hi + lo)^T (or the one term) for one K step.

        ``FUSE``: both terms' products go into one fresh tensor-core accumulator, added to
        ``acc`` once per K step (one promotion, one wait for the MMAs, per step); else
        each product is promoted on its own every PROMOTE elements (None: never)."""
        hi = tl.trans(tl.load(a_ptrs))
        if FUSE:
            part = tl.dot(wv, hi)
            part = tl.dot(wv, tl.trans(tl.load(a_ptrs + lo_off)), part)
            return acc + part
        acc = tl.dot(wv, hi, acc, max_num_imprecise_acc=PROMOTE)
        if TERMS == 2:
            lo = tl.trans(tl.load(a_ptrs + lo_off))
            acc = tl.dot(wv, lo, acc, max_num_imprecise_acc=PROMOTE)
        return acc

    @triton.jit
    def _w8a8_once_kernel(
        a_ptr,
        w_ptr,
        w_desc,
        s_ptr,
        y_ptr,
        qa_ptr,
        sa_ptr,
        sync_ptr,
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
        KP: tl.constexpr,
        TERMS: tl.constexpr,
        PROMOTE: tl.constexpr,
        TMA_W: tl.constexpr,
        FUSE: tl.constexpr,
    ):
        """y[m, n] = s[n] * sa[m] * sum_k qa[m, k] * w[n, k]; one program = BN rows x all M.

        ``sync_ptr``: two int32 zeros (tickets taken, rows done); qa holds BM1 + BM2 rows.
        """
        ROWS: tl.constexpr = BM1 + BM2
        # phase 1: take row tickets until none are left
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        while t < ROWS:
            _quantize_row(a_ptr, qa_ptr, sa_ptr, t, M, K, ROWS, stride_am, KP, TERMS)
            tl.debug_barrier()  # every thread's stores before the release below
            tl.atomic_add(sync_ptr + 1, 1, sem="release")
            t = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        # wait for the rows taken by other programs, reading the count with acquire
        # semantics (Triton 3.6-3.8 emit an add of 0 as ld.global.gpu.acquire: a load, so
        # polling programs put no atomic traffic on the counter; checked in the PTX)
        done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        while done < ROWS:
            done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        tl.debug_barrier()

        # phase 2: fp8 x fp8 on the tensor cores
        pid = tl.program_id(0)
        n0 = pid * BN
        offs_n = n0 + tl.arange(0, BN)
        rows_n = tl.minimum(offs_n, N - 1)
        offs_k = tl.arange(0, BK)
        w_ptrs = w_ptr + rows_n[:, None] * stride_wn + offs_k[None, :]
        offs_m1 = tl.arange(0, BM1)
        a1_ptrs = qa_ptr + offs_m1[:, None] * K + offs_k[None, :]
        acc1 = tl.zeros((BN, BM1), dtype=tl.float32)
        if BM2 > 0:
            offs_m2 = BM1 + tl.arange(0, BM2)
            a2_ptrs = qa_ptr + offs_m2[:, None] * K + offs_k[None, :]
            acc2 = tl.zeros((BN, BM2), dtype=tl.float32)
        lo_off = ROWS * K
        for k in range(0, K, BK):
            if TMA_W:
                wv = w_desc.load([n0, k])
            else:
                wv = tl.load(w_ptrs)
                w_ptrs += BK
            acc1 = _terms_dot(wv, a1_ptrs, lo_off, acc1, TERMS, PROMOTE, FUSE)
            a1_ptrs += BK
            if BM2 > 0:
                acc2 = _terms_dot(wv, a2_ptrs, lo_off, acc2, TERMS, PROMOTE, FUSE)
                a2_ptrs += BK
        s = tl.load(s_ptr + rows_n)
        acc1 = acc1 * tl.load(sa_ptr + offs_m1)[None, :]
        store_logits_t(y_ptr, acc1, s, offs_n, offs_m1, N, M, stride_ym)
        if BM2 > 0:
            acc2 = acc2 * tl.load(sa_ptr + offs_m2)[None, :]
            store_logits_t(y_ptr, acc2, s, offs_n, offs_m2, N, M, stride_ym)


def once_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: W8A8Config,
    out: torch.Tensor,
    compile_only: bool = False,
) -> Any:
    """Launches of at most 256 rows; per launch a scratch of BM1 + BM2 quantized rows (one
    or two e4m3 terms), their scales and two zeroed counters (no host sync: graph-safe)."""
    if cfg.group:
        raise ValueError("once=1 quantizes with one scale per row (group=0)")
    if cfg.tma and TensorDescriptor is None:
        raise RuntimeError("tma configs need Triton's host tensor descriptors (Triton >= 3.4)")
    m, k = a.shape
    n = q.shape[0]
    w_desc = TensorDescriptor.from_tensor(q, [cfg.bn, cfg.bk]) if cfg.tma else q
    grid = (triton.cdiv(n, cfg.bn),)
    for start in range(0, m, MAX_M_PER_LAUNCH):
        rows = min(MAX_M_PER_LAUNCH, m - start)
        bm1, bm2 = cfg.tiles(rows)
        qa = torch.empty((cfg.terms, bm1 + bm2, k), dtype=FP8, device=a.device)
        sa = torch.empty(bm1 + bm2, dtype=torch.float32, device=a.device)
        sync = torch.zeros(2, dtype=torch.int32, device=a.device)
        args = (a[start:], q, w_desc, scale, out[start:], qa, sa, sync, rows, n, k)
        args += (a.stride(0), q.stride(0), out.stride(0))
        meta = dict(BN=cfg.bn, BK=cfg.bk, BM1=bm1, BM2=bm2, KP=triton.next_power_of_2(k))
        meta.update(TERMS=cfg.terms, PROMOTE=cfg.triton_promote(), TMA_W=bool(cfg.tma))
        meta.update(FUSE=bool(cfg.fuse))
        meta.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if compile_only:
            return _w8a8_once_kernel.warmup(*args, grid=grid, **meta)
        _w8a8_once_kernel[grid](*args, **meta)
    return out
