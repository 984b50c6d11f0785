# SPDX-License-Identifier: MIT
"""W8A16: fp8 (e4m3) weights, bf16 activations, fp16 tensor-core MMA, fp32 accumulation.

One program owns a block of BN weight rows and *all* M activation rows (one or two M
tiles, ``m_tiles``), so every weight byte is read from HBM exactly once. The product is
computed transposed (W tile @ A^T): the wide weight block is the MMA's M side and the few
tokens its N side. The weight is widened exactly to fp16 (every e4m3 value is an fp16
value), the activations to fp16 (exact for |a| >= 2^-14); the row scale is applied once in
the epilogue. With <= 2 warps per program Triton emits ``mma.sync`` and feeds the e4m3 tile
through 8-byte shared loads, which wins up to M ~ 48 on an H200 (the repository's
experimental/fp8-head-lab-notes.md has the measurements).

``pad_m``: the activations are copied (widened, with ``pre_a``) into a buffer of zero rows
up to the next multiple of 16 and the kernel runs on that many rows; the caller gets the
first M rows. On an H200 a launch whose M is not a multiple of 16 ran ~12% slower than the
same tiles at M = 48 (M = 36, 40, 44 vs 48; the lab notes have the runs), so M = 40 runs
as 48 rows. ``clamp_m``: rows past M read row M-1 instead of a masked load; it did not help
(those rows all hit one activation row in L2) and is kept only to reproduce that run.

``tma``: the same product with the weight and activation tiles loaded by the copy engine
(Hopper's TMA, through host tensor descriptors) into one power-of-two M tile (``tma=1``) or
two (``tma=2``, as ``m_tiles``); the engine zero-fills rows past M and N, so nothing is
masked. With 4 warps it ran 10-15% faster than the masked loads at M = 48-96 on an H200
(lab notes, run 20).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .configs import MAX_M_PER_LAUNCH, W8A16Config, pad16

try:  # Triton is present wherever vLLM runs on a GPU; CPU-only installs may lack it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    HAVE_TRITON = False
try:  # host-side tensor descriptors (Triton >= 3.4); without them tma configs raise
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


if HAVE_TRITON:

    @triton.jit
    def store_logits_t(y_ptr, acc, s, offs_n, offs_m, N, M, stride_ym):
        """Every kernel's epilogue: the transposed tile ``acc`` [BN, BM] times the weight row
        scales ``s`` [BN], stored as y[m, n] in y's dtype where m < M and n < N."""
        y = (acc * s[:, None]).to(y_ptr.dtype.element_ty)
        ok = (offs_n[:, None] < N) & (offs_m[None, :] < M)
        tl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], y, mask=ok)

    @triton.jit
    def _w8a16_kernel(
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
        CLAMP_M: tl.constexpr,
    ):
        """y[m, n] = s[n] * sum_k a[m, k] * w[n, k]; one program = BN rows of W x all M.

        Requires K % BK == 0 (checked by the wrapper). W rows past N are clamped (read
        twice at the last block, never stored), so W loads carry no mask.
        """
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        rows = tl.minimum(offs_n, N - 1)
        offs_k = tl.arange(0, BK)
        w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
        offs_m1 = tl.arange(0, BM1)
        m1_ok = offs_m1[None, :] < M
        if CLAMP_M:
            a1_ptrs = a_ptr + tl.minimum(offs_m1, M - 1)[None, :] * stride_am + offs_k[:, None]
        else:
            a1_ptrs = a_ptr + offs_m1[None, :] * stride_am + offs_k[:, None]
        acc1 = tl.zeros((BN, BM1), dtype=tl.float32)
        if BM2 > 0:
            offs_m2 = BM1 + tl.arange(0, BM2)
            m2_ok = offs_m2[None, :] < M
            if CLAMP_M:
                a2_ptrs = a_ptr + tl.minimum(offs_m2, M - 1)[None, :] * stride_am + offs_k[:, None]
            else:
                a2_ptrs = a_ptr + offs_m2[None, :] * stride_am + offs_k[:, None]
            acc2 = tl.zeros((BN, BM2), dtype=tl.float32)
        for _k in range(0, K, BK):
            wv = tl.load(w_ptrs).to(tl.float16)
            if CLAMP_M:
                a1 = tl.load(a1_ptrs).to(tl.float16)
            else:
                a1 = tl.load(a1_ptrs, mask=m1_ok, other=0.0).to(tl.float16)
            acc1 = tl.dot(wv, a1, acc1)
            a1_ptrs += BK
            if BM2 > 0:
                if CLAMP_M:
                    a2 = tl.load(a2_ptrs).to(tl.float16)
                else:
                    a2 = tl.load(a2_ptrs, mask=m2_ok, other=0.0).to(tl.float16)
                acc2 = tl.dot(wv, a2, acc2)
                a2_ptrs += BK
            w_ptrs += BK
        s = tl.load(s_ptr + rows)
        store_logits_t(y_ptr, acc1, s, offs_n, offs_m1, N, M, stride_ym)
        if BM2 > 0:
            store_logits_t(y_ptr, acc2, s, offs_n, offs_m2, N, M, stride_ym)


if HAVE_TRITON:

    @triton.jit
    def _w8a16_tma_kernel(
        a_desc,
        a2_desc,
        w_desc,
        s_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_ym,
        BN: tl.constexpr,
        BK: tl.constexpr,
        BM: tl.constexpr,
        BM2: tl.constexpr,
    ):
        """y[m, n] = s[n] * sum_k a[m, k] * w[n, k]; one program = BN rows of W x all M
        (a BM tile, and with BM2 > 0 a second one of BM2 rows after it; rows past M and N
        arrive as zeros from the copy engine)."""
        pid = tl.program_id(0)
        n0 = pid * BN
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        if BM2 > 0:
            acc2 = tl.zeros((BN, BM2), dtype=tl.float32)
        for k in range(0, K, BK):
            wv = w_desc.load([n0, k]).to(tl.float16)
            acc = tl.dot(wv, tl.trans(a_desc.load([0, k])), acc)
            if BM2 > 0:
                acc2 = tl.dot(wv, tl.trans(a2_desc.load([BM, k])), acc2)
        offs_n = n0 + tl.arange(0, BN)
        s = tl.load(s_ptr + tl.minimum(offs_n, N - 1))
        store_logits_t(y_ptr, acc, s, offs_n, tl.arange(0, BM), N, M, stride_ym)
        if BM2 > 0:
            store_logits_t(y_ptr, acc2, s, offs_n, BM + tl.arange(0, BM2), N, M, stride_ym)


def _tma_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: W8A16Config,
    out: torch.Tensor,
    compile_only: bool,
) -> Any:
    """The ``tma`` variant: fp16 activations (widened once, as ``pre_a``, into a buffer of
    zero rows up to a multiple of 16) and the e4m3 weights through tensor descriptors;
    launches of at most 256 rows, one M tile (``tma=1``) or up to two (``tma=2``) each."""
    if TensorDescriptor is None:
        raise RuntimeError("tma configs need Triton's host tensor descriptors (Triton >= 3.4)")
    m, n = a.shape[0], q.shape[0]
    w_desc = TensorDescriptor.from_tensor(q, [cfg.bn, cfg.bk])
    grid = (triton.cdiv(n, cfg.bn),)
    for start in range(0, m, MAX_M_PER_LAUNCH):
        rows = min(MAX_M_PER_LAUNCH, m - start)
        bm, bm2 = cfg.tiles(rows)
        # zero rows up to a multiple of 16, as pad_m: M = 36 through a 36-row descriptor ran
        # 10% slower than M = 40 or 48 on an H200 (run 21)
        a16 = torch.zeros((pad16(rows), a.shape[1]), dtype=torch.float16, device=a.device)
        a16[:rows] = a[start : start + rows]
        a_desc = TensorDescriptor.from_tensor(a16, [bm, cfg.bk])
        a2_desc = TensorDescriptor.from_tensor(a16, [bm2, cfg.bk]) if bm2 else a_desc
        args = (a_desc, a2_desc, w_desc, scale, out[start:], rows, n, a.shape[1], out.stride(0))
        meta = dict(BN=cfg.bn, BK=cfg.bk, BM=bm, BM2=bm2, num_warps=cfg.num_warps)
        meta["num_stages"] = cfg.num_stages
        if compile_only:
            return _w8a16_tma_kernel.warmup(*args, grid=grid, **meta)
        _w8a16_tma_kernel[grid](*args, **meta)
    return out


def launch_row_chunks(
    kernel: Any,
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    cfg: Any,
    const: dict[str, Any],
    compile_only: bool,
) -> Any:
    """Launch a masked-load kernel (W8A16 or W8A8: same pointer arguments) over chunks of
    at most 256 rows, each in one or two M tiles; ``const`` adds the kernel's own
    constexprs. With ``compile_only`` the first chunk's kernel is compiled, not launched."""
    m, n = a.shape[0], q.shape[0]
    grid = (triton.cdiv(n, cfg.bn),)
    for start in range(0, m, MAX_M_PER_LAUNCH):
        rows = min(MAX_M_PER_LAUNCH, m - start)
        bm1, bm2 = cfg.tiles(rows)
        args = (
            a[start:],
            q,
            scale,
            out[start:],
            rows,
            n,
            a.shape[1],
            a.stride(0),
            q.stride(0),
            out.stride(0),
        )
        meta = dict(BN=cfg.bn, BK=cfg.bk, BM1=bm1, BM2=bm2, **const)
        meta.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if compile_only:  # compile (or load from Triton's cache), do not launch
            return kernel.warmup(*args, grid=grid, **meta)
        kernel[grid](*args, **meta)
    return out


def check_operands(a: torch.Tensor, q: torch.Tensor, bk: int) -> None:
    """Shapes and strides both kernels rely on; the message names the mismatch."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    k, kw = a.shape[1], q.shape[1]
    if k != kw or k % bk != 0:
        raise ValueError(f"shape mismatch (a K={k}, q K={kw}) or K not a multiple of BK={bk}")
    if a.stride(1) != 1 or q.stride(1) != 1:
        raise ValueError("a and q must be contiguous along K")


def w8a16_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: W8A16Config | None = None,
    out: torch.Tensor | None = None,
    compile_only: bool = False,
) -> Any:
    """``a`` [M, K] @ (``q`` [N, K] e4m3 * ``scale`` [N]).T -> [M, N] in a's dtype.

    Rows of ``a`` go in launches of at most 256. No host sync, no data-dependent
    allocation: safe inside a CUDA graph capture.
    """
    cfg = cfg or W8A16Config()
    check_operands(a, q, cfg.bk)
    m, n = a.shape[0], q.shape[0]
    if cfg.tma:
        if out is None:
            out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        return _tma_matmul(a, q, scale, cfg, out, compile_only)
    if cfg.pad_m and m % 16:  # zero rows up to a multiple of 16; the caller sees [:m]
        mp = pad16(m)
        dtype = torch.float16 if cfg.pre_a else a.dtype
        padded = torch.zeros((mp, a.shape[1]), dtype=dtype, device=a.device)
        padded[:m] = a
        full = torch.empty((mp, n), dtype=(out if out is not None else a).dtype, device=a.device)
        inner = replace(cfg, pad_m=0, pre_a=0)
        res = w8a16_matmul(padded, q, scale, inner, full, compile_only)
        if compile_only:
            return res
        return full[:m] if out is None else out.copy_(full[:m])
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if cfg.pre_a:
        a = a.to(torch.float16)
    return launch_row_chunks(
        _w8a16_kernel, a, q, scale, out, cfg, {"CLAMP_M": bool(cfg.clamp_m)}, compile_only
    )
