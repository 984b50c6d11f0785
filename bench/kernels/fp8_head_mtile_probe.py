# SPDX-License-Identifier: MIT
"""Probe, on a GPU: the fp8 head at M = 48-160, against the compute roofline.

Two questions, one process, same timing method as the tuner (``fp8_tune.timing``):

1. **The roofline.** Every accuracy-eligible fp8 path does bf16-rate tensor work: W8A16
   multiplies fp16 operands (2·M·N·K flops at the bf16 rate) and two-term W8A8 does two
   fp8 products (twice the flops at twice the rate). So no eligible path can beat
   ``max(fp8 bytes / copy ceiling, 2·M·N·K / sustained bf16 rate)``. This measures both
   ceilings on this GPU (a large device copy; cuBLAS bf16 and ``torch._scaled_mm`` fp8 on a
   large M of the same N, K) and prints the bound on the speed-up over bf16 per M.
2. **An M-tiled W8A16 grid.** The shipped kernel gives each program BN weight rows × *all*
   M rows (one or two M tiles), which at M >= 64 needs a large accumulator per program. Here
   the grid is (N tiles × M tiles of BM rows), the BM programs of one weight tile adjacent
   so the tile is re-read from L2, not HBM; 4 or 8 warps, so Triton may emit warpgroup MMA
   (``wgmma`` in the PTX is recorded per config). Timed beside bf16 cuBLAS and the shipped
   table's choice at each M.

Prints a table per N and writes JSON (``--json``). Needs CUDA and Triton; exits 2 without.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

import torch
from dsv4_flash_overlays.fp8_head.configs import BF16, W8A16Config, lookup_table, pick
from dsv4_flash_overlays.fp8_head.w8a16 import HAVE_TRITON, w8a16_matmul

from bench.kernels.bench_fp8_head import copy_ceiling_gbs, event_median_s
from bench.kernels.fp8_head_probe_kernels import mtile_matmul
from bench.kernels.fp8_tune.reference import dequantize_rowwise
from bench.kernels.fp8_tune.search import precompile, w8a16_grid
from bench.kernels.fp8_tune.table import portable_command
from bench.kernels.fp8_tune.timing import Problem, graph_time_us
from pairctl.cli import options

if HAVE_TRITON:
    import triton


def mtile_grid() -> list[dict[str, int]]:
    """BM × BN × warps × (BK, stages): 4-8 warps, so the MMA may be a warpgroup one."""
    out = []
    for bm, bn, warps, (bk, stages) in itertools.product(
        (16, 32, 64, 128), (64, 128), (4, 8), ((128, 3), (128, 4), (64, 4))
    ):
        if bn == 64 and warps == 8:
            continue  # a 64-row weight tile is one warpgroup's MMA height
        out.append(dict(bm=bm, bn=bn, warps=warps, bk=bk, stages=stages))
    return out


# instructions whose presence says which path Triton took (warpgroup MMA, copy engine,
# register rebalancing between warp-specialised partitions, legacy MMA)
PTX_FEATURES = ("wgmma", "cp.async.bulk.tensor", "setmaxnreg", "mma.sync")


def tma_grid(m: int) -> list[W8A16Config]:
    """Question 4 (run 20): copy-engine (tma) loads on the shipped kernel's best launch
    shapes (2 warps up to M = 48, 4 warps above)."""
    shapes = [(64, 128, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4)]
    if m <= 48:
        shapes += [(64, 128, 2, 3), (128, 128, 2, 3), (64, 256, 2, 3)]
    return [W8A16Config(bn, bk, nw, ns, tma=1) for bn, bk, nw, ns in shapes]


def all_m_grid(m: int) -> list[W8A16Config]:
    """Question 3: the shipped all-M W8A16 kernel with launch shapes the tuner's full
    search does not try at this M (8 warps, BN = 256, BK = 64, 5 stages)."""
    searched = set(w8a16_grid(m, "full"))
    out = []
    for (bn, nw), bk, ns in itertools.product(
        ((64, 2), (64, 4), (128, 4), (128, 8), (256, 8)), (64, 128, 256), (3, 4, 5)
    ):
        cfg = W8A16Config(bn, bk, nw, ns, pre_a=1, pad_m=1)
        if cfg not in searched and bk * ns <= 768:
            out.append(cfg)
    return out


def gemm_tflops(n: int, k: int, m: int, fp8: bool) -> float:
    """Sustained rate of one large product on this shape: cuBLAS bf16, or fp8 rowwise."""
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    if fp8:
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa = torch.ones(m, 1, device="cuda")
        sb = torch.ones(1, n, device="cuda")

        def call() -> object:
            return torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    else:

        def call() -> object:
            return torch.nn.functional.linear(a, w)

    return 2.0 * m * n * k / event_median_s(call, reps=10) / 1e12


def bound_speedup(bf16_us: float, m: int, n: int, k: int, ceil: dict[str, float]) -> float:
    """Best possible speed-up of an eligible fp8 path over the measured bf16 time."""
    fp8_bytes = n * k + 4 * n + 2 * m * k + 2 * m * n
    t_mem = fp8_bytes / (ceil["copy_gbs"] * 1e9)
    t_mma = 2.0 * m * n * k / (ceil["bf16_tflops"] * 1e12)
    return bf16_us / (max(t_mem, t_mma) * 1e6)


def _measure(prob: Problem, a: torch.Tensor, ref: torch.Tensor, run: Any, warm: Any, reps: int):
    """Check one variant against the fp32 reference, then time it over the weight copies."""
    q0, s0 = prob.qs[0]
    try:
        kern = warm(a, q0, s0)
        y = run(a, q0, s0).float()
        err = float((y - ref).norm() / ref.norm())
        if not err < 1e-2:
            return dict(error=f"rel_err {err:.3g}")
        us = graph_time_us([lambda q=q, s=s: run(a, q, s) for q, s in prob.qs], reps=reps)
        kern._init_handles()
        return dict(
            us=us,
            rel_err=err,
            wgmma="wgmma" in kern.asm.get("ptx", ""),
            ptx={k: k in kern.asm.get("ptx", "") for k in PTX_FEATURES},
            regs=int(kern.n_regs),
            spills=int(kern.n_spills),
            shared=int(kern.metadata.shared),
        )
    except Exception as exc:  # out of resources etc.: recorded, not fatal
        return dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")


def variants(m: int, mode: str) -> list[tuple[dict, Any, Any]]:
    """(config as a dict, run(a, q, s), compile(a, q, s)) for each variant timed at ``m``."""
    out = []
    if mode == "mtile":
        for cfg in mtile_grid():
            if cfg["bm"] <= max(16, triton.next_power_of_2(m)):
                out.append(
                    (
                        cfg,
                        lambda a, q, s, c=cfg: mtile_matmul(a, q, s, c),
                        lambda a, q, s, c=cfg: mtile_matmul(a, q, s, c, warm=True),
                    )
                )
    else:
        for cfg in all_m_grid(m) if mode == "all-m" else tma_grid(m):
            out.append(
                (
                    cfg.as_dict(),
                    lambda a, q, s, c=cfg: w8a16_matmul(a, q, s, c),
                    lambda a, q, s, c=cfg: w8a16_matmul(a, q, s, c, compile_only=True),
                )
            )
    return out


def probe_shape(
    n: int,
    k: int,
    ms: list[int],
    reps: int,
    ceil: dict[str, float],
    mode: str,
) -> list[dict]:
    """Time bf16, the shipped choice and every variant of ``mode`` at each M, for one N."""
    if mode == "all-m":  # compile in parallel worker processes into Triton's cache first
        precompile([(c, m, n) for m in ms for c in all_m_grid(m)], k, workers=14)
    prob = Problem(n, k)
    table = lookup_table(torch.cuda.get_device_name(), n, k) or {}
    q0, s0 = prob.qs[0]
    w0 = dequantize_rowwise(q0, s0).float()
    rows = []
    for m in ms:
        a = prob.act(m)
        ref = a.float() @ w0.t()
        bf16_us = graph_time_us(prob.calls(BF16, a), reps=reps)
        shipped = pick(table, m) if table else BF16
        ship_us = bf16_us if shipped == BF16 else graph_time_us(prob.calls(shipped, a), reps=reps)
        res = []
        for cfg, run, warm in variants(m, mode):
            t_var = time.time()
            r = _measure(prob, a, ref, run, warm, reps)
            res.append(dict(cfg=cfg, seconds=time.time() - t_var, **r))
            got = f"{r['us']:.1f} us" if "us" in r else r["error"][:100]
            print(f"  M={m} {describe(cfg)}: {got} ({time.time() - t_var:.0f} s)", flush=True)
        ok = [r for r in res if "us" in r]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        rows.append(
            dict(
                n=n,
                m=m,
                mode=mode,
                bf16_us=bf16_us,
                shipped=str(shipped),
                shipped_us=ship_us,
                best=best,
                bound=bound_speedup(bf16_us, m, n, k, ceil),
                configs=res,
            )
        )
        b = f"{best['us']:.1f} ({bf16_us / best['us']:.2f}x)" if best else "-"
        print(f"N={n} M={m}: bf16 {bf16_us:.1f} shipped {bf16_us / ship_us:.2f}x {mode} {b}")
        sys.stdout.flush()
    return rows


def describe(cfg: dict[str, int]) -> str:
    """A config in one short string (only the knobs that vary)."""
    keys = ("bm", "bn", "warps", "num_warps", "bk", "stages", "num_stages", "tma")
    return "/".join(f"{k}={cfg[k]}" for k in keys if k in cfg)


def print_table(rows: list[dict]) -> None:
    print("| N | M | probe | bf16 µs | shipped × | best µs | × | config | wgmma | bound × |")
    print("|---:|---:|---|---:|---:|---:|---:|---|---|---:|")
    for r in rows:
        b = r["best"]
        desc, bt, bx, wg = "-", "-", "-", "-"
        if b:
            desc, wg = describe(b["cfg"]), str(b["wgmma"])
            bt, bx = f"{b['us']:.1f}", f"{r['bf16_us'] / b['us']:.2f}"
        print(
            f"| {r['n']} | {r['m']} | {r['mode']} | {r['bf16_us']:.1f} "
            f"| {r['bf16_us'] / r['shipped_us']:.2f} | {bt} | {bx} | {desc} | {wg} "
            f"| {r['bound']:.2f} |"
        )


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument("--n", type=int, nargs="+", default=[129280, 64640])
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--m", type=int, nargs="+", default=[48, 64, 80, 96, 112, 128, 144, 160])
    p.add_argument("--reps", type=int, default=15, help="graph replays per timing (median)")
    p.add_argument(
        "--probe",
        choices=("mtile", "all-m", "tma"),
        default="mtile",
        help="mtile: the M-tiled grid (run 17); all-m: the shipped kernel with launch "
        "shapes the tuner's full search does not try at that M; tma: the shipped kernel's "
        "copy-engine (tma) variant",
    )
    p.add_argument("--json", help="write every timing here (rewritten after each shape)")


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, p = options.namespace(
        argv, add_cli_args, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    if not (torch.cuda.is_available() and HAVE_TRITON):
        print("needs a CUDA GPU and Triton", file=sys.stderr)
        return 2
    t0 = time.time()
    ceil = dict(
        copy_gbs=copy_ceiling_gbs(),
        bf16_tflops=gemm_tflops(args.n[0], args.k, 4096, fp8=False),
        fp8_tflops=gemm_tflops(args.n[0], args.k, 4096, fp8=True),
        bf16_tflops_8192cube=gemm_tflops(8192, 8192, 8192, fp8=False),
    )
    print("ceilings:", {k: round(v, 1) for k, v in ceil.items()}, flush=True)
    meta = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=portable_command("bench.kernels.fp8_head_mtile_probe", sys.argv[1:]),
    )
    rows: list[dict] = []
    for n in args.n:
        rows += probe_shape(n, args.k, args.m, args.reps, ceil, args.probe)
        if args.json:  # after each shape, so a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(
                    dict(meta=dict(meta, seconds=time.time() - t0), ceilings=ceil, rows=rows),
                    f,
                    indent=1,
                )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
