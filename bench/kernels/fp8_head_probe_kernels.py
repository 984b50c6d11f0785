# SPDX-License-Identifier: MIT
"""Kernel variants the fp8 head probe (``fp8_head_mtile_probe.py``) times beside the shipped
ones. None of them ships: each is an experiment recorded in experimental/fp8-head-lab-notes.md.

* ``mtile_matmul`` (run 17): a grid over N tiles × M tiles instead of one program per N tile
  holding all M rows.

(Run 20's copy-engine variant started here and now ships: ``W8A16Config(tma=1)``.)
"""

from __future__ import annotations

from typing import Any

import torch
from dsv4_flash_overlays.fp8_head.w8a16 import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl
    from dsv4_flash_overlays.fp8_head.w8a16 import store_logits_t

    @triton.jit
    def _w8a16_mtile_kernel(
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
        BM: tl.constexpr,
    ):
        """y[m, n] = s[n] * sum_k a[m, k] * w[n, k]; one program = BN weight rows × BM rows.

        Program order: the M tiles of one weight tile are consecutive programs.
        """
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BM)
        pid_n = pid // num_m
        pid_m = pid % num_m
        offs_n = pid_n * BN + tl.arange(0, BN)
        rows = tl.minimum(offs_n, N - 1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        m_ok = offs_m[None, :] < M
        offs_k = tl.arange(0, BK)
        w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
        a_ptrs = a_ptr + offs_m[None, :] * stride_am + offs_k[:, None]
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for _k in range(0, K, BK):
            wv = tl.load(w_ptrs).to(tl.float16)
            av = tl.load(a_ptrs, mask=m_ok, other=0.0).to(tl.float16)
            acc = tl.dot(wv, av, acc)
            w_ptrs += BK
            a_ptrs += BK
        store_logits_t(y_ptr, acc, tl.load(s_ptr + rows), offs_n, offs_m, N, M, stride_ym)


def mtile_matmul(
    a: torch.Tensor, q: torch.Tensor, s: torch.Tensor, cfg: dict[str, int], warm: bool = False
) -> Any:
    """``a`` [M, K] bf16 @ (``q`` [N, K] e4m3 * ``s``).T with the M-tiled grid."""
    m, k = a.shape
    n = q.shape[0]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(n, cfg["bn"]) * triton.cdiv(m, cfg["bm"]),)
    args = (a, q, s, out, m, n, k, a.stride(0), q.stride(0), out.stride(0))
    meta = dict(
        BN=cfg["bn"],
        BK=cfg["bk"],
        BM=cfg["bm"],
        num_warps=cfg["warps"],
        num_stages=cfg["stages"],
    )
    if warm:
        return _w8a16_mtile_kernel.warmup(*args, grid=grid, **meta)
    _w8a16_mtile_kernel[grid](*args, **meta)
    return out
