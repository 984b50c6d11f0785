# SPDX-License-Identifier: MIT
"""Quantize-once W8A8 with the warpgroup MMAs kept in flight (``W8A8Config(once=1, wgmma=1)``).

Why: the Triton quantize-once kernel (``w8a8_once.py``, ``fuse=1``) adds each K step's
tensor-core partial sum into the fp32 accumulator, and Triton then waits for every MMA of
that step before it issues the next step's (``wgmma.wait_group 0``; lab notes, runs 25-34).
The tensor cores idle during each promotion, which is what keeps that kernel at 1.5x and
below from M = 72. This kernel is written in Gluon (Triton's explicit-layout language,
``triton.experimental.gluon``, Triton >= 3.5) to control the waits by hand, as DeepGEMM's
fp8 GEMMs do on Hopper: step i's two MMAs (16 hi + lo, one fresh tensor-core accumulator)
are issued, *then* the kernel waits only for step i - 1's (``warpgroup_mma_wait(2)``) and
adds that partial sum into the fp32 accumulator while step i's run. Two tensor-core
accumulators alternate; the promotion arithmetic is the fused kernel's, step for step, so
it is the same accuracy family (``w8a8-t2-row-p256`` at BK = 128).

Phase 1 (row tickets, release/acquire counters zeroed per launch) is ``w8a8_once.py``'s.
The quantized rows are then read by the copy engine (TMA), which is the *async proxy*: the
writer and the reader each issue ``fence.proxy.async.global`` so that the generic-proxy
stores of other programs are visible to it (PTX ISA, "Memory consistency model: proxies").
Hopper only (SM 9.x: warpgroup MMA); the tuner offers it nowhere else.
"""

from __future__ import annotations

from typing import Any

import torch

from .configs import W8A8Config
from .quant import FP8

try:  # Gluon ships with Triton >= 3.5; older Tritons simply do not offer this kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    # the CTA barrier: thread_barrier in Triton 3.5-3.6, barrier from 3.7
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    HAVE_GLUON = True
except Exception:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

MAX_ROWS = 128  # rows per launch: three BN x rows fp32 tiles live in registers

if HAVE_GLUON:
    _TINY = gl.constexpr(2.0**-96)  # quant.TINY

    @gluon.jit
    def _proxy_fence(x):
        """``fence.proxy.async.global``: order this thread's generic-proxy view of global
        memory with its later (or earlier) copy-engine accesses; returns ``x``."""
        return gl.inline_asm_elementwise(
            "fence.proxy.async.global; mov.b32 $0, $1;",
            "=r,r",
            [x],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def _quantize_row(
        a_ptr,
        qa_ptr,
        sa_ptr,
        row,
        M,
        K,
        stride_am,
        ROWS: gl.constexpr,
        KP: gl.constexpr,
        layout: gl.constexpr,
    ):
        """Row ``row`` -> 16 * hi in qa[row], lo in qa[ROWS + row], amax / 448 in sa[row],
        exactly ``quant.quantize_act(..., terms=2)``; a row >= M becomes zeros."""
        offs = gl.arange(0, KP, layout=gl.SliceLayout(0, layout))[None, :]
        ok = (offs < K) & (row < M)
        a = gl.load(a_ptr + row * stride_am + offs, mask=ok, other=0.0).to(gl.float32)
        amax = gl.maximum(gl.max(gl.abs(a), axis=1), _TINY)
        vec: gl.constexpr = gl.SliceLayout(1, layout)
        inv = gl.div_rn(gl.full([1], 28.0, gl.float32, layout=vec), amax)
        x = a * inv[:, None]
        hi = x.to(gl.float8e4nv).to(gl.float32)
        dst = qa_ptr + row * K + offs
        k_ok = offs < K
        gl.store(dst, (hi * 16.0).to(gl.float8e4nv), mask=k_ok)
        gl.store(dst + ROWS * K, ((x - hi) * 16.0).to(gl.float8e4nv), mask=k_ok)
        sc = gl.div_rn(amax, gl.full([1], 448.0, gl.float32, layout=vec))
        gl.store(sa_ptr + row + gl.arange(0, 1, layout=vec), sc)

    @gluon.jit
    def _issue_step(
        j,
        nk,
        pid,
        nprog,
        w_desc,
        a1_desc,
        a2_desc,
        w_smem,
        a1_smem,
        a2_smem,
        ready,
        BK: gl.constexpr,
        BM1: gl.constexpr,
        BM2: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Copy engine: flat step j (this program's N tile j // nk, K step j % nk): the
        weight tile and the activation tiles (hi and lo of each M tile) into stage
        j % STAGES. qa rows: hi of tiles 1, 2, then lo of tiles 1, 2."""
        s = j % STAGES
        bar = ready.index(s)
        BN: gl.constexpr = w_desc.block_type.shape[0]
        mbarrier.expect(bar, (BN + 2 * (BM1 + BM2)) * BK)  # e4m3: one byte each
        k = (j % nk) * BK
        n0 = (pid + (j // nk) * nprog) * BN
        tma.async_copy_global_to_shared(w_desc, [n0, k], bar, w_smem.index(s))
        tma.async_copy_global_to_shared(a1_desc, [0, k], bar, a1_smem.index(2 * s))
        tma.async_copy_global_to_shared(a1_desc, [BM1 + BM2, k], bar, a1_smem.index(2 * s + 1))
        if BM2 > 0:
            tma.async_copy_global_to_shared(a2_desc, [BM1, k], bar, a2_smem.index(2 * s))
            tma.async_copy_global_to_shared(
                a2_desc, [2 * BM1 + BM2, k], bar, a2_smem.index(2 * s + 1)
            )

    @gluon.jit
    def _terms(w_tile, a_smem, s, zero):
        """16 hi + lo of one M tile for one K step, into a fresh tensor-core accumulator."""
        acc = warpgroup_mma(
            w_tile, a_smem.index(2 * s).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        return warpgroup_mma(w_tile, a_smem.index(2 * s + 1).permute((1, 0)), acc, is_async=True)

    @gluon.jit
    def _refill(
        i,
        total,
        nk,
        pid,
        nprog,
        w_desc,
        a1_desc,
        a2_desc,
        w_smem,
        a1_smem,
        a2_smem,
        ready,
        BK: gl.constexpr,
        BM1: gl.constexpr,
        BM2: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """After step i - 1's MMAs are done its stage takes step i + STAGES - 1."""
        if i + STAGES - 1 < total:
            _issue_step(
                i + STAGES - 1,
                nk,
                pid,
                nprog,
                w_desc,
                a1_desc,
                a2_desc,
                w_smem,
                a1_smem,
                a2_smem,
                ready,
                BK,
                BM1,
                BM2,
                STAGES,
            )

    @gluon.jit
    def _store_tile(
        y_ptr,
        acc,
        sa_ptr,
        s_ptr,
        n0,
        m0,
        N,
        M,
        stride_ym,
        BN: gl.constexpr,
        BM: gl.constexpr,
        acc_layout: gl.constexpr,
        NW: gl.constexpr,
    ):
        """store_logits_t's arithmetic for rows m0 .. m0 + BM, stored coalesced along n."""
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))
        offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
        acc = acc * gl.load(sa_ptr + offs_m)[None, :]
        s_row = gl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)
        y = (acc * s_row[:, None]).to(y_ptr.dtype.element_ty)
        out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [32, 1], [1, NW], [0, 1])
        y = gl.convert_layout(y, out_layout)
        on = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, out_layout))
        om = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, out_layout))
        ok = (on[:, None] < N) & (om[None, :] < M)
        gl.store(y_ptr + om[None, :] * stride_ym + on[:, None], y, mask=ok)

    @gluon.jit
    def _w8a8_async_kernel(
        a_ptr,
        w_desc,
        a1_desc,
        a2_desc,
        s_ptr,
        y_ptr,
        qa_ptr,
        sa_ptr,
        sync_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ym,
        BN: gl.constexpr,
        BK: gl.constexpr,
        BM1: gl.constexpr,
        BM2: gl.constexpr,
        KP: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """y[m, n] = s[n] * sa[m] * sum_k (16 hi + lo)[m, k] * w[n, k] / 16; one program =
        BN weight rows x all rows (M tiles of BM1 and BM2 rows; BM2 may be 0).
        ``sync_ptr``: two int32 zeros."""
        NW: gl.constexpr = gl.num_warps()
        ROWS: gl.constexpr = BM1 + BM2
        # ---- phase 1: quantize, one row per ticket (see w8a8_once.py) ----
        row_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, NW], [1, 0])
        t = gl.atomic_add(sync_ptr, 1, sem="relaxed")
        while t < ROWS:
            _quantize_row(a_ptr, qa_ptr, sa_ptr, t, M, K, stride_am, ROWS, KP, row_layout)
            t = _proxy_fence(t)  # the rows are read by the copy engine
            _cta_barrier()  # every thread's stores (and fence) before the release
            gl.atomic_add(sync_ptr + 1, 1, sem="release")
            t = gl.atomic_add(sync_ptr, 1, sem="relaxed")
        done = gl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        while done < ROWS:
            done = gl.atomic_add(sync_ptr + 1, 0, sem="acquire")
        _cta_barrier()
        done = _proxy_fence(done)

        # ---- phase 2: persistent; one flat sequence of (N tile, K step) for the copy
        # engine, so the next tile's loads run during this tile's last steps and epilogue
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        my_tiles = (gl.cdiv(N, BN) - pid + nprog - 1) // nprog
        nk = K // BK
        total = my_tiles * nk
        w_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], w_desc.layout)
        a1_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES, BM1, BK], a1_desc.layout)
        a2_smem = a1_smem
        if BM2 > 0:
            a2_smem = gl.allocate_shared_memory(
                gl.float8e4nv, [2 * STAGES, BM2, BK], a2_desc.layout
            )
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        for j in gl.static_range(STAGES - 1):
            if j < total:
                _issue_step(
                    j,
                    nk,
                    pid,
                    nprog,
                    w_desc,
                    a1_desc,
                    a2_desc,
                    w_smem,
                    a1_smem,
                    a2_smem,
                    ready,
                    BK,
                    BM1,
                    BM2,
                    STAGES,
                )

        l1: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM1, 32]
        )
        zero1 = gl.zeros([BN, BM1], gl.float32, l1)
        B2: gl.constexpr = BM2 if BM2 > 0 else 8
        l2: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, B2, 32]
        )
        zero2 = gl.zeros([BN, B2], gl.float32, l2)
        G: gl.constexpr = 2 if BM2 == 0 else 4  # MMA groups per K step
        i = 0  # this program's flat step
        for t in range(my_tiles):
            acc1 = zero1
            acc2 = zero2
            # Two steps per iteration, each into fresh tensor-core accumulators: both are
            # issued, then the first is promoted while the second's MMAs run. Nothing is in
            # flight across the loop's back edge: ptxas cannot follow that, and serializes
            # every warpgroup MMA when it sees it (C7514; read offline, Triton 3.6's ptxas).
            for kk in range(0, nk, 2):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                f1 = _terms(w_smem.index(s), a1_smem, s, zero1)
                if BM2 > 0:
                    f2 = _terms(w_smem.index(s), a2_smem, s, zero2)
                s = (i + 1) % STAGES
                mbarrier.wait(ready.index(s), ((i + 1) // STAGES) & 1)
                g1 = _terms(w_smem.index(s), a1_smem, s, zero1)
                if BM2 > 0:
                    g2 = _terms(w_smem.index(s), a2_smem, s, zero2)
                    f1, f2 = warpgroup_mma_wait(num_outstanding=G, deps=(f1, f2))
                    acc2 = acc2 + f2
                else:
                    f1 = warpgroup_mma_wait(num_outstanding=G, deps=(f1,))
                acc1 = acc1 + f1
                # steps i - 1 and i are done: their stages take i + STAGES - 1, i + STAGES
                _refill(
                    i,
                    total,
                    nk,
                    pid,
                    nprog,
                    w_desc,
                    a1_desc,
                    a2_desc,
                    w_smem,
                    a1_smem,
                    a2_smem,
                    ready,
                    BK,
                    BM1,
                    BM2,
                    STAGES,
                )
                _refill(
                    i + 1,
                    total,
                    nk,
                    pid,
                    nprog,
                    w_desc,
                    a1_desc,
                    a2_desc,
                    w_smem,
                    a1_smem,
                    a2_smem,
                    ready,
                    BK,
                    BM1,
                    BM2,
                    STAGES,
                )
                if BM2 > 0:
                    g1, g2 = warpgroup_mma_wait(num_outstanding=0, deps=(g1, g2))
                    acc2 = acc2 + g2
                else:
                    g1 = warpgroup_mma_wait(num_outstanding=0, deps=(g1,))
                acc1 = acc1 + g1
                i += 2
            n0 = (pid + t * nprog) * BN
            _store_tile(y_ptr, acc1, sa_ptr, s_ptr, n0, 0, N, M, stride_ym, BN, BM1, l1, NW)
            if BM2 > 0:
                _store_tile(y_ptr, acc2, sa_ptr, s_ptr, n0, BM1, N, M, stride_ym, BN, BM2, l2, NW)
        for j in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(j))


def async_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: W8A8Config,
    out: torch.Tensor,
    compile_only: bool = False,
) -> Any:
    """One launch for M <= MAX_ROWS rows: a scratch of 2 x BM quantized rows (hi, then lo),
    their scales and two zeroed counters (no host sync: graph-safe)."""
    if not HAVE_GLUON:
        raise RuntimeError("wgmma=1 needs Triton's Gluon (Triton >= 3.5)")
    m, k = a.shape
    n = q.shape[0]
    bm1, bm2 = cfg.tiles(m)
    if bm1 + bm2 > MAX_ROWS or cfg.terms != 2 or k % (2 * cfg.bk):
        raise ValueError(f"wgmma=1 takes terms=2, M <= {MAX_ROWS}, K % 2BK == 0 (M={m}, K={k})")
    rows = bm1 + bm2
    qa = torch.empty((2 * rows, k), dtype=FP8, device=a.device)
    sa = torch.empty(rows, dtype=torch.float32, device=a.device)
    sync = torch.zeros(2, dtype=torch.int32, device=a.device)
    descs = []
    for t, r in ((q, cfg.bn), (qa, bm1), (qa, bm2 or bm1)):
        layout = gl.NVMMASharedLayout.get_default_for([r, cfg.bk], gl.float8e4nv)
        descs.append(GluonDescriptor.from_tensor(t, [r, cfg.bk], layout))
    tiles = (n + cfg.bn - 1) // cfg.bn
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(tiles, sms * cfg.persist),) if cfg.persist else (tiles,)
    args = (a, *descs, scale, out, qa, sa, sync, m, n, k, a.stride(0), out.stride(0))
    meta = dict(BN=cfg.bn, BK=cfg.bk, BM1=bm1, BM2=bm2, KP=1 << (k - 1).bit_length())
    meta.update(STAGES=cfg.num_stages)
    if cfg.num_warps == 16 or (cfg.num_warps == 8 and 3 * cfg.bn * rows <= 120 * 32 * 8):
        meta["maxnreg"] = 128  # 16 warps: the register file; 8: two programs per SM
    if compile_only:
        return _w8a8_async_kernel.warmup(*args, grid=grid, num_warps=cfg.num_warps, **meta)
    _w8a8_async_kernel[grid](*args, num_warps=cfg.num_warps, **meta)
    return out
