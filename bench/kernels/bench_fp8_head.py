#!/usr/bin/env python3
"""Benchmark (and tune) the fp8 DSpark draft head against bf16 cuBLAS, on one GPU, one run.

For N in {129280, 64640} (full vocab, one TP=2 shard) and K = 4096, in one process:
  --check     correctness of both kernels (W8A16, W8A8 in every accuracy family) on ragged
              shapes, poisoned outputs, against exact references;
  --cliff     the M = 33..47 experiment: W8A16 at M = 40 and 48 with masked vs clamped
              activation rows, and M = 40 launched as 48 padded rows;
  --tune      the tuner (``bench.kernels.fp8_tune.tune``): accuracy per
              family, then every candidate per M, writes the table to --configs-out;
  --dispatch  what the overlay runs (``Fp8Head`` with the table) against bf16 and the
              naive path (per-token fp8 activations in torch ops + ``torch._scaled_mm``)
              at every --dispatch-m, tuned or not; --untuned does the same with the
              untuned default table.
Every timing: CUDA-graph replays over rotated weight copies (>= 4x L2), random data,
medians, with the copy ceiling (device-to-device copy, bytes read + written) measured in the
same run. Prints a table and writes everything to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from dsv4_flash_overlays.fp8_head import configs as C
from dsv4_flash_overlays.fp8_head.dispatch import Fp8Head, scaled_mm_head
from dsv4_flash_overlays.fp8_head.quant import quantize_rowwise
from dsv4_flash_overlays.fp8_head.w8a8 import w8a8_matmul
from dsv4_flash_overlays.fp8_head.w8a16 import w8a16_matmul

from bench.kernels.fp8_tune import search as S
from bench.kernels.fp8_tune import tune as T
from bench.kernels.fp8_tune.reference import fp8_head_matmul_ref, w8a8_ref
from bench.kernels.fp8_tune.table import merge_into_file, portable_command
from bench.kernels.fp8_tune.timing import Problem, graph_time_us
from pairctl.cli import options

K = 4096
NS = (129280, 64640)
TUNE_MS = (1, 5, 10, 16, 20, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 120, 128, 144, 160)
DISPATCH_MS = (1, 3, 5, 8, 10, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 64, 72, 80, 88)
DISPATCH_MS += (96, 104, 112, 120, 128, 136, 144, 152, 160)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--n", type=int, nargs="+", default=list(NS))
    p.add_argument("--m", type=int, nargs="+", default=list(TUNE_MS), help="tuned M")
    p.add_argument("--dispatch-m", type=int, nargs="+", default=list(DISPATCH_MS))
    p.add_argument("--check", action="store_true")
    p.add_argument("--cliff", action="store_true")
    p.add_argument("--tune", action="store_true")
    p.add_argument("--dispatch", action="store_true")
    p.add_argument("--untuned", action="store_true")
    p.add_argument("--grid", choices=("quick", "full"), default="full")
    p.add_argument("--explore", action="store_true", help="--tune: time ineligible families too")
    p.add_argument("--w8a8-grid", choices=("quick", "full"), help="W8A8 search (default: --grid)")
    p.add_argument("--eval-rows", type=int, default=16384)
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--workers", type=int, default=min(14, max(1, (os.cpu_count() or 2) - 1)))
    p.add_argument("--reps", type=int, default=15, help="replays per timing while tuning")
    p.add_argument("--dispatch-reps", type=int, default=25, help="replays per final timing")
    p.add_argument("--configs-out", type=Path, default=C.CONFIG_PATH)


def parse_args(argv: argparse.Namespace | list[str] | None = None) -> argparse.Namespace:
    return options.namespace(
        argv, add_cli_args, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )[0]


def event_median_s(fn: Any, warmups: int = 3, reps: int = 15) -> float:
    """Median seconds of eager ``fn()`` calls, each timed with CUDA events."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        fn()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en) * 1e-3)
    return statistics.median(times)


def copy_ceiling_gbs(nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth (bytes read + written), best of two copy kernels,
    eager launches timed with events (in a graph a copy_ becomes a slower memcpy node)."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    fns = (lambda: dst.copy_(src), lambda: torch.add(src, 0, out=dst))
    return max(2 * nbytes / event_median_s(fn) / 1e9 for fn in fns)


def check_configs() -> list[C.Choice]:
    out: list[C.Choice] = [
        C.W8A16Config(128, 128, 4, 3),
        C.W8A16Config(64, 256, 2, 3, clamp_m=1),
        C.W8A16Config(128, 256, 2, 3, pad_m=1),
        C.W8A16Config(64, 128, 4, 3, pre_a=1, pad_m=1),
        C.W8A16Config(128, 128, 2, 3, pre_a=1, single_tile=1),
        C.UNTUNED_SMALL_M,
        C.SCALED_MM,
    ]
    for terms in (1, 2):
        for group in (0, 128):
            out.append(C.W8A8Config(128, 128, 4, 3, terms=terms, group=group))
    out.append(C.W8A8Config(64, 128, 2, 3, terms=1, group=0, promote=32))
    out.append(C.W8A8Config(256, 128, 8, 3, terms=2, group=128))
    out.append(C.W8A8Config(128, 128, 4, 3, terms=2, once=1))
    out.append(C.W8A8Config(64, 128, 2, 3, terms=1, once=1, tma=1, promote=0))
    out.append(C.W8A8Config(256, 128, 8, 3, terms=2, once=1, tma=1, promote=0, single_tile=1))
    out.append(C.W8A8Config(128, 128, 8, 3, terms=2, once=1, tma=1, fuse=1))
    out.append(C.W8A8Config(64, 128, 4, 3, terms=2, once=1, fuse=1, single_tile=1))
    return out


def _run_into(choice: C.Choice, a: torch.Tensor, q, s, out: torch.Tensor) -> None:
    """Write ``choice``'s result into ``out`` (the kernels store into it directly)."""
    if isinstance(choice, C.W8A16Config):
        w8a16_matmul(a, q, s, choice, out=out)
    elif isinstance(choice, C.W8A8Config):
        w8a8_matmul(a, q, s, choice, out=out)
    else:
        out.copy_(scaled_mm_head(a, q, s))


def run_checks(workers: int) -> list[dict[str, Any]]:
    """Ragged N, M = 1..300, a zero weight row and a zero activation row, NaN-poisoned
    outputs; error vs the exact product of the operands each path quantizes."""
    out = []
    limit = C.device_smem_limit()
    gen = torch.Generator(device="cuda").manual_seed(7)
    shapes = [(1000, 1), (777, 17), (4099, 40), (2048, 80), (3000, 144), (1500, 300)]
    S.precompile([(c, min(m, 256), n) for n, m in shapes for c in check_configs()], K, workers)
    for n, m in shapes:
        w = torch.randn(n, K, device="cuda", generator=gen) * 0.02
        w[3] = 0.0
        q, s = quantize_rowwise(w)
        a = torch.randn(m, K, device="cuda", generator=gen).to(torch.bfloat16)
        if m > 1:
            a[0] = 0.0  # a zero row (an all-zero single row would leave no reference norm)
        for choice in check_configs():
            if not C.fits(choice, min(m, 256), limit) or (choice == C.SCALED_MM and n % 16):
                continue
            num = C.numerics_of(choice)
            if num.terms == 0:
                ref = fp8_head_matmul_ref(a, q, s)
            else:
                ref = w8a8_ref(a, q, s, num.terms, num.group)
            rec: dict[str, Any] = {"n": n, "m": m, "choice": C.choice_to_json(choice)}
            try:
                y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                _run_into(choice, a, q, s, y)
                torch.cuda.synchronize()
                unwritten = int(torch.isnan(y).sum())
                rel = float((y.double().nan_to_num() - ref).norm() / ref.norm())
                tol = 4e-3 if num.terms == 0 else 1.5e-2
                rec.update(rel_err=rel, unwritten=unwritten, ok=rel < tol and unwritten == 0)
            except Exception as exc:
                rec.update(error=f"{type(exc).__name__}: {str(exc)[:200]}", ok=False)
            out.append(rec)
            print(f"check {json.dumps(rec)}", flush=True)
    return out


# ----------------------------------------------------------------------------------- cliff
def run_cliff(ns: list[int], reps: int, workers: int) -> list[dict[str, Any]]:
    """W8A16 at M = 32..48 with the M = 40 config of the earlier table, same run, variants:
    masked (the kernel as it was), clamped (rows past M read row M-1: no load mask),
    padded-launch (the bench appends copies of the last row up to 48 and launches 48 rows),
    pad_m (the wrapper pads with zero rows to a multiple of 16)."""
    base = C.W8A16Config(64, 128, 2, 3, pre_a=1)
    variants = {
        "masked": base,
        "clamped": replace(base, clamp_m=1),
        "padded-launch": base,
        "pad_m": replace(base, pad_m=1),
    }
    cases = [
        (32, "masked"), (36, "masked"), (40, "masked"), (44, "masked"), (48, "masked"),
        (36, "clamped"), (40, "clamped"), (44, "clamped"), (48, "clamped"),
        (40, "padded-launch"),
        (33, "pad_m"), (36, "pad_m"), (40, "pad_m"), (44, "pad_m"), (47, "pad_m"),
    ]  # fmt: skip
    out = []
    for n in ns:
        prob = Problem(n, K)
        launch_m = {v: (48 if v == "padded-launch" else m) for m, v in cases}
        S.precompile([(variants[v], launch_m[v] if v == "padded-launch" else m, n)
                      for m, v in cases], K, workers)  # fmt: skip
        for m, variant in cases:
            cfg = variants[variant]
            a = prob.act(m)
            if variant == "padded-launch":  # rows m..47: copies of row m-1, own memory
                a = torch.cat([a, a[-1:].expand(48 - m, -1)]).contiguous()
            t = graph_time_us(prob.calls(cfg, a), reps=reps)
            t_bf16 = graph_time_us(prob.calls(C.BF16, prob.act(m)), reps=reps)
            rec = {"n": n, "m": m, "variant": variant, "launched_rows": a.shape[0], "us": t}
            rec.update(bf16_us=t_bf16, speedup=t_bf16 / t, cfg=cfg.as_dict())
            out.append(rec)
            print(f"cliff {json.dumps(rec)}", flush=True)
        del prob
        torch.cuda.empty_cache()
    return out


# -------------------------------------------------------------------------------- dispatch
def run_dispatch(
    ns: list[int], ms: list[int], reps: int, table_path: Path, untuned: bool, workers: int
) -> list[dict[str, Any]]:
    """The overlay's ``Fp8Head`` (table lookup, fallback) vs bf16 and the naive path."""
    rows = []
    dev = torch.cuda.get_device_name()
    limit = C.device_smem_limit()
    for n in ns:
        if untuned:
            table = dict(C.UNTUNED_TABLE)
        else:
            table = C.lookup_table(dev, n, K, path=table_path, smem_limit=limit)
            if table is None:
                print(f"dispatch: no table entry for {dev} N={n}; skipped", flush=True)
                continue
        S.precompile([(C.pick(table, m), m, n) for m in ms], K, workers)
        prob = Problem(n, K)
        heads = []
        for w, (q, s) in zip(prob.w, prob.qs, strict=True):
            h = Fp8Head.__new__(Fp8Head)  # reuse the rotated fp8 copies
            h.weight, h.q, h.scale, h.table, h.failed = w, q, s, table, set()
            heads.append(h)
        for m in ms:
            a = prob.act(m)
            # bf16 before and after the head (A-B-A): clock drift between the two timings
            # shows up as a spread, not as a speed-up
            t_bf16_a = graph_time_us(prob.calls(C.BF16, a), reps=reps)
            t_head = graph_time_us([lambda h=h, a=a: h(a) for h in heads], reps=reps)
            t_bf16_b = graph_time_us(prob.calls(C.BF16, a), reps=reps)
            t_bf16 = (t_bf16_a + t_bf16_b) / 2
            try:
                t_naive = graph_time_us(prob.calls(C.SCALED_MM, a), reps=reps)
            except Exception as exc:
                print(f"naive scaled_mm failed n={n} m={m}: {exc}", flush=True)
                t_naive = None
            choice = C.pick(table, m)
            rec = {
                "n": n,
                "m": m,
                "bf16_us": t_bf16,
                "bf16_before_after_us": [t_bf16_a, t_bf16_b],
                "head_us": t_head,
                "naive_us": t_naive,
                "path": choice if isinstance(choice, str) else C.family(choice),
                "choice": C.choice_to_json(choice),
                "speedup": t_bf16 / t_head,
                "naive_speedup": t_bf16 / t_naive if t_naive else None,
                "failed": sorted(heads[0].failed),
            }
            rows.append(rec)
            print(f"dispatch {json.dumps(rec)}", flush=True)
        del prob, heads
        torch.cuda.empty_cache()
    return rows


def fp8_bytes(n: int, m: int) -> int:
    """Fewest bytes of an fp8 path: weights once + row scales + activations + logits."""
    return n * K + 4 * n + m * K * 2 + m * n * 2


def print_dispatch(rows: list[dict[str, Any]], ceiling: float, title: str) -> None:
    print(f"\n{title} (copy ceiling {ceiling:.0f} GB/s)")
    print("     N |   M |  bf16 us | naive us |  head us | % ceil | path        | head x | naive x")
    for r in rows:
        pct = 100 * fp8_bytes(r["n"], r["m"]) / r["head_us"] / 1e3 / ceiling
        naive = "—" if r["naive_us"] is None else f"{r['naive_us']:8.1f}"
        nx = "—" if r["naive_speedup"] is None else f"{r['naive_speedup']:.2f}"
        print(
            f"{r['n']:>6} | {r['m']:>3} | {r['bf16_us']:8.1f} | {naive:>8} | {r['head_us']:8.1f}"
            f" | {pct:6.1f} | {r['path']:<11} | {r['speedup']:6.2f} | {nx:>7}"
        )


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    info = T.env_info()
    print(json.dumps(info), flush=True)
    result: dict[str, Any] = {
        "schema_version": 2,
        "gpu": info,
        "k": K,
        "command": portable_command("bench.kernels.bench_fp8_head", sys.argv[1:]),
    }

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))

    ceiling = copy_ceiling_gbs()
    result["copy_ceiling_gbs"] = ceiling
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    if args.check:
        result["checks"] = run_checks(args.workers)
        save()
    if args.cliff:
        result["cliff"] = run_cliff(args.n, args.dispatch_reps, args.workers)
        save()
    if args.tune:
        t0 = time.time()
        acc = T.accuracy(args.n[0], K, args.eval_rows) if args.eval_rows else {}
        result["accuracy"] = acc
        eligible = {f for f, r in acc.items() if r["eligible"]} or {"w8a16"}
        print(f"accuracy {json.dumps(acc)}\neligible {sorted(eligible)}", flush=True)
        save()
        limit = info["smem_per_block_optin"]
        deadline = time.time() + args.budget_s

        def progress(_entries: dict, rows: list) -> None:
            result["tune_rows"] = rows
            save()

        # every shape gets the full search (the shard is what deploys)
        entries, rows = T.tune_shapes(
            info["device"], args, K, eligible, limit, deadline, False, on_shape=progress
        )
        meta = {k: {**info, "accuracy": acc, "command": result["command"]} for k in entries}
        merge_into_file(args.configs_out, entries, meta)
        result["table"] = entries
        result["tune_seconds"] = time.time() - t0
        result["cliffs"] = T.cliffs(rows)
        save()
    if args.dispatch:
        result["dispatch_rows"] = run_dispatch(
            args.n, args.dispatch_m, args.dispatch_reps, args.configs_out, False, args.workers
        )
        save()
    if args.untuned:
        result["untuned_rows"] = run_dispatch(
            args.n, args.dispatch_m, args.dispatch_reps, args.configs_out, True, args.workers
        )
        save()
    for r in result.get("cliff", []):
        print(
            f"cliff N={r['n']} M={r['m']} {r['variant']} rows={r['launched_rows']}: "
            f"{r['us']:.1f} us, bf16 {r['bf16_us']:.1f}, {r['speedup']:.2f}x"
        )
    for line in result.get("cliffs", []):
        print(f"tuned speed-up drop > 10%: {line}")
    if "dispatch_rows" in result:
        print_dispatch(result["dispatch_rows"], ceiling, f"{info['device']}: overlay head, tuned")
    if "untuned_rows" in result:
        print_dispatch(result["untuned_rows"], ceiling, f"{info['device']}: untuned default")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
