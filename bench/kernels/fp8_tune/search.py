# SPDX-License-Identifier: MIT
"""The tuner's search space and its parallel compile step.

Candidates per M: W8A16 configs, and those of the eligible W8A8 accuracy families, each
shrunk (fewer stages, shorter K step) until its shared-memory need fits the GPU; they are
compiled in spawned worker processes into Triton's on-disk cache, so that the timing loop
in the parent only loads binaries.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import torch
from dsv4_flash_overlays.fp8_head.configs import (
    GROUP_K,
    SCALED_MM,
    UNTUNED_SMALL_M,
    Choice,
    W8A8Config,
    W8A16Config,
    choice_to_json,
    family,
    fits,
    parse_choice,
)


# ------------------------------------------------------------------------------ candidates
def family_representatives() -> dict[str, Choice]:
    """One small config per accuracy family (fits 64 KB of shared memory at M <= 64)."""
    reps: dict[str, Choice] = {"w8a16": UNTUNED_SMALL_M}
    for terms in (1, 2):
        for group in (0, GROUP_K):
            c = W8A8Config(bn=64, bk=128, num_warps=4, num_stages=2, terms=terms, group=group)
            reps[family(c)] = c
        # both terms per promotion, or none (the accumulation differs: own families)
        for fuse, promote in ((terms == 2, 128), (False, 0)):
            c = W8A8Config(64, 128, 4, 2, terms=terms, once=1, fuse=int(fuse), promote=promote)
            reps.setdefault(family(c), c)  # (t1 with promotion is the family above)
    reps[SCALED_MM] = SCALED_MM
    return reps


def w8a16_grid(m: int, grid: str) -> list[W8A16Config]:
    """Search space per M (H200 runs in experimental/fp8-head-lab-notes.md: mma.sync with
    <= 2 warps wins up to M ~ 48, BN = 64 with 4 warps above; M padded to a multiple of 16
    avoids the slow launches at other M; copy-engine (tma) loads from M > 16)."""
    if m <= 16:
        shapes = [(128, 2), (64, 2), (64, 1), (32, 1)]
        bks, pres, stages = (256, 128), (0, 1), (3,)
    elif m <= 64:
        shapes = [(64, 2), (128, 2), (64, 4), (32, 2)]
        bks, pres, stages = (128, 256), (1,), (3, 4)
    else:
        shapes = [(64, 4), (128, 4), (64, 2), (128, 8)]
        bks, pres, stages = (128,), (1,), (3, 4)
    # a tuned entry also serves the M below it: at a multiple of 16 padding is free there
    # and keeps the M in between off the slow launches; elsewhere both are timed
    pads = (0, 1) if m % 16 else (1,)
    # copy-engine loads, 4 warps (warpgroup MMA on Hopper): 10-15% faster than the masked
    # loads at M = 48-96 (run 20); (BN, BK, stages, warps)
    tma = [(64, 128, 3, 4), (128, 64, 4, 4), (128, 128, 3, 4), (64, 128, 4, 4), (128, 64, 5, 4)]
    tma += [(64, 256, 3, 4), (128, 128, 3, 8)]
    tma = tma if m > 16 else []
    # and with two M tiles (64 + 16 rows rather than one of 128, as the masked kernel); BN 64
    # won there in run 23, so more of its K steps and depths
    tma2 = [(64, 128, 3, 4), (128, 64, 4, 4), (64, 128, 4, 4), (64, 256, 2, 4), (64, 256, 3, 4)]
    tma2 += [(64, 64, 5, 4), (64, 64, 6, 4), (128, 128, 3, 8)]
    tma2 = tma2 if W8A16Config(tma=2).tiles(m)[1] else []
    if grid == "quick":
        shapes, bks, stages, tma, tma2 = shapes[:2], bks[:1], stages[:1], tma[:2], tma2[:1]
    return [
        W8A16Config(bn, bk, nw, ns, pre_a=pre, pad_m=pad)
        for bn, nw in shapes
        for bk in bks
        for pre in pres
        for ns in stages
        for pad in pads
    ] + [
        W8A16Config(bn, bk, nw, ns, tma=t) for t, g in ((1, tma), (2, tma2)) for bn, bk, ns, nw in g
    ]


def w8a8_grid(m: int, grid: str, terms: int, group: int) -> list[W8A8Config]:
    """W8A8 search space: the weight tile straight from shared memory to the MMA, so larger
    BN (fewer programs, fewer re-reads and re-quantizations of the activations) can pay."""
    if m < 16:  # W8A16 already streams the weights at the copy ceiling there
        return []
    shapes = [(128, 4), (128, 8), (256, 8), (64, 4), (64, 2)]
    stages = (3, 4)
    if grid == "quick":
        shapes, stages = shapes[:3], (3,)
    return [
        W8A8Config(bn, 128, nw, ns, terms=terms, group=group) for bn, nw in shapes for ns in stages
    ] + (once_grid(m, grid, terms) if group == 0 else [])


def once_grid(m: int, grid: str, terms: int) -> list[W8A8Config]:
    """W8A8 with the activations quantized once per launch (``w8a8_once.py``): a plain
    fp8 GEMM after the quantization phase, weight tiles by the copy engine; one padded M
    tile where ``m_tiles`` would split M. Each promotion into the fp32 accumulator makes
    ptxas wait for the warpgroup MMAs, so two terms go through one accumulator per K step
    (``fuse=1``, its own accuracy family), beside a promotion per term (DeepSeek-V3's
    every 128) and none (``promote=0``). (BN, BK, warps, stages)"""
    if m <= 16:  # W8A16 already streams the weights at the copy ceiling there
        return []
    if m <= 64:
        shapes = [(64, 128, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3), (64, 128, 4, 4)]
        shapes += [(128, 64, 4, 4), (64, 64, 4, 4)]
    else:  # from BK 64 on: smaller stages, more programs per SM at large M
        shapes = [(128, 128, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (64, 128, 4, 3)]
        shapes += [(64, 64, 4, 4), (128, 64, 4, 4), (128, 64, 8, 4), (64, 64, 4, 6)]
    if grid == "quick":
        shapes = shapes[:3]
    base = W8A8Config(terms=terms, once=1, tma=1, fuse=int(terms == 2))
    out = [replace(base, bn=bn, bk=bk, num_warps=nw, num_stages=ns) for bn, bk, nw, ns in shapes]
    if base.tiles(m)[1]:
        out += [replace(c, single_tile=1) for c in out[:2]]
    return out + [replace(out[0], fuse=0, promote=p) for p in (128, 0)]


def candidates(
    m: int, grid: str, eligible: set[str], limit: int, n: int = 16, w8a8_grid_name: str = ""
) -> list[Choice]:
    """Every config worth timing at ``m`` on a GPU with ``limit`` bytes of shared memory
    (``torch._scaled_mm`` needs N % 16 == 0). Eligibility is checked after shrinking: a
    shorter K step can move a fused W8A8 config into another accuracy family."""
    out: list[Choice] = list(w8a16_grid(m, grid))
    for terms in (1, 2):
        for group in (0, GROUP_K):
            out += w8a8_grid(m, w8a8_grid_name or grid, terms, group)
    if n % 16 == 0:
        out.append(SCALED_MM)
    fitted = (shrink_to_fit(c, m, limit) for c in out)
    return list(dict.fromkeys(c for c in fitted if c and family(c) in eligible | {"w8a16"}))


def shrink_to_fit(c: Choice, m: int, limit: int) -> Choice | None:
    """``c``, or the same config with fewer stages / a shorter K step that fits ``limit``
    bytes of shared memory at ``m`` (GB10: 99 KB), or None."""
    while not fits(c, m, limit):
        if c.num_stages > 2:
            c = replace(c, num_stages=c.num_stages - 1)
        elif c.bk > 64 and not getattr(c, "group", 0):
            c = replace(c, bk=c.bk // 2)
        else:
            return None
    return c


# ------------------------------------------------------------------------- parallel compile
def _compile_one(task: tuple[Any, int, int, int]) -> dict[str, Any]:
    """Worker: compile one (config, M, N) for this GPU into Triton's cache; its resources."""
    obj, m, n, k = task
    choice = parse_choice(obj)
    try:
        from dsv4_flash_overlays.fp8_head.w8a8 import w8a8_matmul
        from dsv4_flash_overlays.fp8_head.w8a16 import w8a16_matmul

        a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        q = torch.empty((n, k), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        s = torch.empty(n, dtype=torch.float32, device="cuda")
        fn = w8a16_matmul if isinstance(choice, W8A16Config) else w8a8_matmul
        kern = fn(a, q, s, choice, compile_only=True)
        res = {"shared": int(kern.metadata.shared)}
        try:  # registers and spills are known once the binary is loaded
            kern._init_handles()
            res.update(regs=int(kern.n_regs), spills=int(kern.n_spills))
        except Exception:
            pass
        return res
    except Exception as exc:  # reported, and the config is skipped
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def precompile(tasks: list[tuple[Choice, int, int]], k: int, workers: int) -> dict:
    """Compile every kernel (config, M, N) in parallel worker processes (Triton's on-disk
    cache makes the later launches here cheap); {(choice, m, n): resources or error}."""
    kernels = list(dict.fromkeys((c, m, n) for c, m, n in tasks if not isinstance(c, str)))
    if workers <= 0 or not kernels:
        return {}
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            jobs = [(choice_to_json(c), m, n, k) for c, m, n in kernels]
            res = dict(zip(kernels, pool.map(_compile_one, jobs), strict=True))
    except Exception as exc:  # a broken pool only costs time: compile on first use instead
        print(f"parallel compile failed ({type(exc).__name__}: {exc}); compiling serially")
        return {}
    errs = sum("error" in r for r in res.values())
    print(f"compiled {len(res)} kernels in {time.time() - t0:.0f} s ({errs} failed)", flush=True)
    return res
