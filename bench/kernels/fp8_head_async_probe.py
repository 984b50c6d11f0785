#!/usr/bin/env python3
"""Probe, on a Hopper GPU: the Gluon quantize-once W8A8 kernel (``wgmma=1``) against the
shipped table, bf16, and the Triton kernel with the same arithmetic.

The Gluon kernel (``fp8_head/w8a8_async.py``) keeps one K step's warpgroup MMAs running
while the other's partial sum is promoted; the Triton quantize-once kernel with ``fuse=1``
does the same arithmetic with a full wait per step. Per M and N this prints and records:

* bf16 (cuBLAS) and the shipped table's choice, timed as the tuner times (CUDA graph,
  rotated weight copies: ``fp8_head.timing``);
* every Gluon config of the grid: time, error against the exact product of its quantized
  operands, and whether its output equals the Triton fused kernel's (same BK) bit for bit.

    python -m bench.kernels.fp8_head_async_probe --json FILE [--m 20 40 ...] [--n 129280]

Exits 2 without CUDA, an SM 9.x GPU or Gluon.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

import torch
from dsv4_flash_overlays.fp8_head.configs import BF16, W8A8Config, lookup_table, pick
from dsv4_flash_overlays.fp8_head.dispatch import run_choice
from dsv4_flash_overlays.fp8_head.search import precompile
from dsv4_flash_overlays.fp8_head.timing import Problem, graph_time_us

K = 4096
MS = (20, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112, 128)
# (BN, BK, warps, stages)
# (BN, BK, warps, stages, programs per SM of a persistent grid; 0: one per N tile)
GRID = (
    (128, 128, 4, 3, 0),
    (128, 128, 8, 3, 2),
    (256, 128, 8, 4, 1),
    (256, 128, 8, 3, 1),
    (256, 64, 8, 6, 1),
    (128, 128, 8, 4, 1),
    (256, 128, 16, 3, 1),
)
BASE = W8A8Config(terms=2, once=1, tma=1, fuse=1)


def async_grid(m: int) -> list[W8A8Config]:
    """The grid at ``m``, less configs whose three BN x BM fp32 tiles exceed ~200
    registers per thread (ptxas would spill them)."""
    out = []
    for bn, bk, nw, ns, per in GRID:
        for single in (0, 1):
            c = replace(
                BASE,
                bn=bn,
                bk=bk,
                num_warps=nw,
                num_stages=ns,
                wgmma=1,
                persist=per,
                single_tile=single,
            )
            rows = sum(c.tiles(m))
            if 3 * bn * rows // (32 * nw) <= 200 and rows <= 128 and c not in out:
                if not single or c.tiles(m) != replace(c, single_tile=0).tiles(m):
                    out.append(c)
    return out


def probe(n: int, ms: list[int], reps: int) -> list[dict[str, Any]]:
    prob = Problem(n, K)
    name = torch.cuda.get_device_name()
    table = lookup_table(name, n, K) or {}
    q0, s0 = prob.qs[0]
    rows = []
    for m in ms:
        a = prob.act(m)
        bf16 = graph_time_us(prob.calls(BF16, a), reps=reps)
        row: dict[str, Any] = {"n": n, "m": m, "bf16_us": bf16, "configs": []}
        if table:
            shipped = pick(table, m)
            row["shipped"] = shipped if isinstance(shipped, str) else shipped.as_dict()
            row["shipped_us"] = graph_time_us(prob.calls(shipped, a), reps=reps)
        for cfg in async_grid(m):
            ref = replace(cfg, wgmma=0, persist=0, num_stages=3, num_warps=min(cfg.num_warps, 8))
            rec: dict[str, Any] = {"config": cfg.as_dict()}
            try:
                y = run_choice(cfg, a, q0, s0)
                y_ref = run_choice(ref, a, q0, s0)
                torch.cuda.synchronize()
                rec["equal_to_triton"] = bool(torch.equal(y, y_ref))
                rec["max_abs_diff"] = float((y.float() - y_ref.float()).abs().max())
                rec["rel_err"] = prob.rel_error(cfg, a)
                rec["us"] = graph_time_us(prob.calls(cfg, a), reps=reps)
                rec["speedup"] = bf16 / rec["us"]
            except Exception as exc:  # recorded, the probe goes on
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["configs"].append(rec)
        ok = [c for c in row["configs"] if "us" in c]
        best = min(ok, key=lambda c: c["us"]) if ok else None
        shipped_txt = f"{row['shipped_us']:7.1f}" if "shipped_us" in row else "      -"
        best_txt = (
            f"{best['us']:7.1f} {bf16 / best['us']:5.2f}x eq={best['equal_to_triton']} "
            f"{best['config']['bn']}/{best['config']['bk']}/{best['config']['num_warps']}w/"
            f"{best['config']['num_stages']}s/st{best['config']['single_tile']}/p{best['config']['persist']}"
            if best
            else "-"
        )
        sp = f"{bf16 / row['shipped_us']:5.2f}x" if "shipped_us" in row else "  -  "
        print(
            f"N={n:6d} M={m:4d} bf16 {bf16:7.1f}  shipped {shipped_txt} {sp}  gluon {best_txt}",
            flush=True,
        )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[129280, 64640])
    ap.add_argument("--m", type=int, nargs="+", default=list(MS))
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--workers", type=int, default=12, help="parallel compile processes")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an SM 9.x GPU (warpgroup MMA)", file=sys.stderr)
        return 2
    from dsv4_flash_overlays.fp8_head.w8a8_async import HAVE_GLUON

    if not HAVE_GLUON:
        print("needs Triton's Gluon (Triton >= 3.5)", file=sys.stderr)
        return 2
    t0 = time.time()
    tasks = [(c, m, n) for n in args.n for m in args.m for c in async_grid(m)]
    tasks += [
        (replace(c, wgmma=0, persist=0, num_stages=3, num_warps=min(c.num_warps, 8)), m, n)
        for c, m, n in tasks
    ]
    res = precompile(tasks, K, args.workers)
    failed = {str(k[0]): v["error"] for k, v in res.items() if "error" in v}
    for k, v in list(failed.items())[:5]:
        print(f"compile failed: {k}: {v}")
    out = {
        "device": torch.cuda.get_device_name(),
        "triton": __import__("triton").__version__,
        "command": " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "compiled": {f"{c.as_dict()}|{m}|{n}": r for (c, m, n), r in res.items()},
        "rows": [],
    }
    for n in args.n:
        out["rows"] += probe(n, args.m, args.reps)
    out["seconds"] = time.time() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"done in {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
