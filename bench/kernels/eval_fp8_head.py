#!/usr/bin/env python3
"""Accuracy of the fp8 draft head, per path: logit errors, argmax agreement with bf16, bounds.

Every path the dispatcher can choose is evaluated on the same rows of the evaluation set
(``bench.kernels.fp8_tune.evalset``: a synthetic heavy-tailed head and hidden states
with drawn top-1 margins, or ``--weights`` for a real lm_head shard): W8A16; W8A8 with one
or two e4m3 activation terms, per-row or per-1x128-block scales; ``torch._scaled_mm`` with
per-row fp8 activations. For each path:
  * relative logit error of the path vs float64 of the *bf16* head, and vs float64 of the
    exact product of the operands the path itself quantizes (the accumulation error);
  * argmax agreement with the bf16 head;
  * for every disagreement, the bf16 margin between the two tokens against the derived
    bound (``ErrorBound``: weight and activation rounding, accumulation, output rounding;
    hard and 6 sigma), and the largest |error| / 6-sigma bound over the float64 rows.
On a CPU (``--device cpu``) the kernels are replaced by their exact torch emulation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from dsv4_flash_overlays.fp8_head import configs as C
from dsv4_flash_overlays.fp8_head import quant as Q
from dsv4_flash_overlays.fp8_head.dispatch import run_choice

from bench.kernels.fp8_tune import reference as R
from bench.kernels.fp8_tune.evalset import EvalSet, synthetic_weight
from bench.kernels.fp8_tune.search import family_representatives
from bench.kernels.fp8_tune.tune import AGREEMENT_SLACK
from pairctl.cli import options


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument("--weights", type=Path, help="safetensors file holding an lm_head shard")
    p.add_argument("--key", default="lm_head.weight", help="tensor name in --weights")
    p.add_argument("--n", type=int, default=129280, help="vocab rows (synthetic W)")
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--rows", type=int, default=16384, help="hidden states evaluated")
    p.add_argument("--chunk", type=int, default=40, help="rows per call (draft M)")
    p.add_argument("--f64-rows", type=int, default=256, help="rows also checked in float64")
    p.add_argument("--paths", nargs="+", help="families to evaluate (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path)


def parse_args(argv: argparse.Namespace | list[str] | None = None) -> argparse.Namespace:
    return options.namespace(
        argv, add_cli_args, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )[0]


def _emulated(choice: C.Choice) -> Callable[..., torch.Tensor]:
    """CPU stand-in for a path: its exact torch emulation."""
    num = C.numerics_of(choice)
    if num.terms == 0:
        return lambda h, q, s: R.emulate_kernel(h, q, s)
    return lambda h, q, s: R.emulate_w8a8(h, q, s, num.terms, num.group)


def evaluate_path(
    ev: EvalSet,
    q: torch.Tensor,
    scale: torch.Tensor,
    bound: R.ErrorBound,
    choice: C.Choice,
    f64_rows: int,
    on_gpu: bool,
) -> dict[str, Any]:
    """Agreement, errors and bound checks of one path over the whole set."""
    num = C.numerics_of(choice)
    fn = (lambda h, q, s: run_choice(choice, h, q, s)) if on_gpu else _emulated(choice)
    wd = R.dequantize_rowwise(q, scale)
    agree, seen = 0, 0
    disagreements: list[dict[str, Any]] = []
    num_rel = den_rel = num_own = den_own = 0.0
    worst_over_stat = 0.0
    for h, top2 in zip(ev.hidden, ev.top2, strict=True):
        z8 = fn(h, q, scale).float()
        a_bf = top2.indices[:, 0]
        a_8 = z8.argmax(dim=1)
        same = a_bf == a_8
        agree += int(same.sum())
        hard, stat = bound(h, num)
        if seen < f64_rows:
            exact = h.double() @ ev.w.double().t()
            a_hat = (
                h.double()
                if num.terms == 0
                else Q.quantize_act(h, num.terms, num.group).dequantize()
            )
            own = a_hat @ wd.t()
            num_rel += float(((z8.double() - exact) ** 2).sum())
            den_rel += float((exact**2).sum())
            num_own += float(((z8.double() - own) ** 2).sum())
            den_own += float((own**2).sum())
            ratio = ((z8.double() - exact).abs() / stat.double()).max()
            worst_over_stat = max(worst_over_stat, float(ratio))
        if not bool(same.all()):
            z_bf = (h @ ev.w.t()).float()
            for i in torch.nonzero(~same).flatten().tolist():
                j, r = int(a_bf[i]), int(a_8[i])
                m_pair = float(z_bf[i, j] - z_bf[i, r])
                bh, bs = float(hard[i, j] + hard[i, r]), float(stat[i, j] + stat[i, r])
                disagreements.append(
                    {
                        "row": seen + i,
                        "bf16_margin_pair": m_pair,
                        "bound_hard": bh,
                        "bound_stat": bs,
                        "within_hard": m_pair <= bh,
                        "within_stat": m_pair <= bs,
                    }
                )
        seen += h.shape[0]
    return {
        "choice": C.choice_to_json(choice),
        "numerics": num.__dict__,
        "argmax_agreement": agree / ev.rows,
        "num_disagreements": len(disagreements),
        "rel_logit_err_vs_f64_of_bf16_head": (num_rel / den_rel) ** 0.5 if den_rel else None,
        "rel_logit_err_vs_f64_of_own_operands": (num_own / den_own) ** 0.5 if den_own else None,
        "max_abs_err_over_stat_bound": worst_over_stat,
        "all_within_hard_bound": all(d["within_hard"] for d in disagreements),
        "all_within_stat_bound": all(d["within_stat"] for d in disagreements),
        "largest_disagreement_margin": max(
            (d["bf16_margin_pair"] for d in disagreements), default=0.0
        ),
        "largest_margin_over_stat_bound": max(
            (d["bf16_margin_pair"] / d["bound_stat"] for d in disagreements), default=0.0
        ),
        "disagreements": disagreements[:100],
    }


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    dev = args.device
    gen = torch.Generator().manual_seed(args.seed)
    if args.weights:
        from safetensors.torch import load_file

        w = load_file(str(args.weights))[args.key].to(device=dev, dtype=torch.bfloat16)
        source = f"{args.weights}:{args.key}"
    else:
        w = synthetic_weight(args.n, args.k, gen, dev)
        source = "synthetic (Student-t 5 dof, std 0.04, LogNormal(0,0.25) row norms)"
    t0 = time.time()
    ev = EvalSet(w, args.rows, args.chunk, args.seed)
    q, s = Q.quantize_rowwise(w)
    bound = R.ErrorBound(w, q, s)
    reps = family_representatives()
    paths = {}
    for fam in args.paths or list(reps):
        try:
            paths[fam] = evaluate_path(ev, q, s, bound, reps[fam], args.f64_rows, dev == "cuda")
        except Exception as exc:  # e.g. no rowwise _scaled_mm on this GPU: say so, go on
            paths[fam] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(f"{fam}: {json.dumps({k: v for k, v in paths[fam].items() if k != 'disagreements'})}")
    base = paths.get("w8a16", {}).get("argmax_agreement")
    for fam, r in paths.items():
        if "argmax_agreement" in r and base is not None:
            r["eligible"] = fam == "w8a16" or r["argmax_agreement"] >= base - AGREEMENT_SLACK
    am = ev.margins()
    qs = torch.quantile(am, torch.tensor([0.01, 0.1, 0.5, 0.9]))
    return {
        "source": source,
        "n": w.shape[0],
        "k": w.shape[1],
        "rows": args.rows,
        "chunk": args.chunk,
        "device": torch.cuda.get_device_name() if dev == "cuda" else dev,
        "margin_quantiles_nats": dict(
            zip(("p1", "p10", "p50", "p90"), map(float, qs), strict=True)
        ),
        "frac_margin_below_0.1": float((am < 0.1).float().mean()),
        "paths": paths,
        "seconds": time.time() - t0,
    }


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args = parse_args(argv)
    res = evaluate(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}: {res['rows']} rows, N={res['n']}, chunk {res['chunk']}")
    print("path          | agreement | differ | vs bf16 f64 | vs own f64 | all in bound | eligible")
    ok = True
    for fam, r in res["paths"].items():
        if "error" in r:
            print(f"{fam:<13} | error: {r['error'][:80]}")
            continue
        inside = r["all_within_hard_bound"]
        ok &= inside
        where = "hard+6σ" if inside and r["all_within_stat_bound"] else "hard" if inside else "NO"
        print(
            f"{fam:<13} | {100 * r['argmax_agreement']:8.3f}% | {r['num_disagreements']:6d} | "
            f"{r['rel_logit_err_vs_f64_of_bf16_head']:.3e}   | "
            f"{r['rel_logit_err_vs_f64_of_own_operands']:.3e}  | "
            f"{where:>12} "
            f"| {r.get('eligible')}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
