"""Performance model of DSpark decode of DeepSeek-V4-Flash on a DGX Spark pair.

Why decode runs at ~14.5 verify steps/s, what tok/s an acceptance profile buys, what the
aggregate ceiling is vs --max-num-seqs, why wider (tree) speculation does not pay, and what
the field's decode levers (spin budget, CUDA graph mode, adaptive verification) should buy
here, beside what peers measured.
Every formula is in docs/performance-model.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from pairctl.cli.argtypes import (
    non_negative_int,
    output_file_or_stdout,
    positive_float,
    positive_int,
)
from pairctl.cli.options import usage_error
from pairctl.contracts import PERFMODEL_EXITS, codes, exit_line
from perfmodel import budget as B
from perfmodel import group as G
from perfmodel import report

_EXIT = codes(PERFMODEL_EXITS)
EXIT_OK, EXIT_ERROR, EXIT_USAGE = _EXIT["EXIT_OK"], _EXIT["EXIT_ERROR"], _EXIT["EXIT_USAGE"]


def _number(text: str, what: str, ok) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    return _number(text, "a number >= 0", lambda v: v >= 0)


def _fraction(text: str) -> float:
    return _number(text, "a fraction in (0, 1]", lambda v: 0 < v <= 1)


def _trials(text: str) -> int:
    value = non_negative_int(text)
    if value == 1:
        raise argparse.ArgumentTypeError("must be 0 (skip the simulation) or >= 2, got '1'")
    return value


def _floats(text: str) -> list[float]:
    """Acceptance probabilities: comma-separated numbers in [0, 1]."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers: {text}") from e
    if not vals or any(not math.isfinite(v) or not 0 <= v <= 1 for v in vals):
        raise argparse.ArgumentTypeError(f"acceptance values must be in [0, 1], got {text!r}")
    return vals


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text}") from e
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return vals


EXAMPLE = "Example: python -m perfmodel --accept 0.85 --bw-gbs 273 --json model.json"
EPILOG = EXAMPLE + "\n\n" + exit_line(PERFMODEL_EXITS)


def parse_args(argv: argparse.Namespace | list[str] | None = None) -> argparse.Namespace:
    """The flags (``add_cli_args``), checked; a Namespace ``dspark perfmodel`` parsed is
    checked only."""
    p = None
    if isinstance(argv, argparse.Namespace):
        a = argv
    else:
        p = argparse.ArgumentParser(
            prog="python -m perfmodel",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EPILOG,
        )
        add_cli_args(p)
        a = p.parse_args(argv)
    if len(a.accept) not in (1, a.gamma):
        usage_error(
            p or a._parser, f"--accept needs 1 or gamma={a.gamma} values, got {len(a.accept)}"
        )
    if a.fabric == "ring" and a.allreduce == "tree":
        usage_error(
            p or a._parser,
            "--allreduce tree needs a switched fabric: a switchless ring links neighbours only",
        )
    if a.replicated_share > 1:
        usage_error(p or a._parser, "--replicated-share must be a fraction in [0, 1]")
    return a


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """The model's inputs and outputs as flags onto ``p``."""
    p.add_argument(
        "--bw-gbs",
        type=positive_float,
        default=235.0,
        help="LPDDR5X bandwidth per GB10 in GB/s (seed: ~235; spec peak 273)",
    )
    p.add_argument(
        "--moe-eff",
        type=_fraction,
        default=B.SEED.moe_eff,
        help="achieved fraction of bandwidth in the MoE kernels (seed: 0.87). "
        "Changes the MoE time only with --routing uniform; in calibrated mode "
        "the seed's 30 ms is kept and this changes the fitted locality rho",
    )
    p.add_argument("--link-gbps", type=positive_float, default=200.0, help="RoCE rail speed, Gb/s")
    p.add_argument(
        "--rails", type=positive_int, default=2, help="RoCE rails in use (one port per card)"
    )
    p.add_argument(
        "--gamma",
        type=positive_int,
        default=5,
        help="draft tokens per step (DSpark block size; the checkpoint has 5)",
    )
    p.add_argument(
        "--accept",
        type=_floats,
        default=[B.REF_ALPHA],
        help="acceptance: one alpha for every position, or gamma comma-separated "
        "values (default 0.8, an assumption mid-way in the seed's tok/s band)",
    )
    p.add_argument(
        "--accept-kind",
        choices=("conditional", "rate"),
        default="conditional",
        help="conditional: P(k accepted | 1..k-1 accepted); rate: P(first k "
        "accepted), i.e. vLLM's accepted_tokens_per_pos / num_drafts",
    )
    p.add_argument(
        "--tree-width",
        type=positive_int,
        default=2,
        help="width of the tree compared against the chain (verifies width*(gamma+1) tokens)",
    )
    p.add_argument(
        "--m",
        type=_ints,
        default=[1, 2, 6, 12, 24, 48, 144],
        dest="paging_m",
        help="verified-token counts M for the expert-paging table",
    )
    p.add_argument("--max-num-seqs", type=positive_int, default=24, help="vLLM --max-num-seqs")
    p.add_argument(
        "--per-seq-ms",
        type=_non_negative,
        default=None,
        help="cost per extra sequence in a batch (default: calibrated so that the "
        "seed's 131 tok/s at 24 seqs holds)",
    )
    p.add_argument(
        "--routing",
        choices=B.ROUTING_MODES,
        default="calibrated",
        help="expert-union model: calibrated (locality fitted to the seed's MoE "
        "time), uniform (independent top-6, pure bytes), seed (249/256 formula)",
    )
    p.add_argument(
        "--draft-head",
        choices=("fp8", "bf16"),
        default="fp8",
        help="draft lm_head dtype (VLLM_DSPARK_FP8_DRAFT_HEAD=1 is fp8)",
    )
    p.add_argument(
        "--spin-budget-ms",
        type=_non_negative,
        default=None,
        help="the shm queue readers' busy-spin budget (VLLM_DSV4_SPIN_BUDGET_MS; default: "
        "vLLM's own 1 s, as the seed measured); calibrated on a peer's 2 ms A/B",
    )
    p.add_argument(
        "--nodes",
        type=int,
        choices=G.NODES,
        default=2,
        help="Sparks in the TP group (TP=N; 2 = a pair, today's numbers). 4 adds the TP=4 "
        "prediction beside tonyd2wild's measured TP=4 C1 figures",
    )
    p.add_argument(
        "--fabric",
        choices=G.FABRICS,
        default="switched",
        help="switched RoCE (any rank reaches any) or a switchless ring (neighbours only)",
    )
    p.add_argument(
        "--allreduce",
        choices=G.ALGOS,
        default="ring",
        help="NCCL all-reduce algorithm: ring (2(N-1) latency steps) or tree (2 log2 N; "
        "switched fabric only)",
    )
    p.add_argument(
        "--replicated-share",
        type=_non_negative,
        default=0.0,
        help="share of the dense + weight-only GEMM time that is replicated on every rank "
        "and does not shrink with N (default 0: an upper bound on the TP=4 gain)",
    )
    p.add_argument(
        "--mc-trials",
        type=_trials,
        default=2000,
        help="Monte-Carlo trials per M (0 = skip the simulation)",
    )
    p.add_argument(
        "--mc-seed", type=non_negative_int, default=0, help="Monte-Carlo RNG seed (>= 0)"
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        type=output_file_or_stdout,
        default=None,
        help="also write one JSON document to FILE (as every tool's --json FILE); '-' prints "
        "it on stdout instead of the tables",
    )


def acceptance(a: argparse.Namespace) -> B.Acceptance:
    vals = a.accept * a.gamma if len(a.accept) == 1 else a.accept
    if a.accept_kind == "rate":
        if len(a.accept) == 1:
            vals = [a.accept[0] ** (k + 1) for k in range(a.gamma)]
        return B.Acceptance.from_rates(vals)
    return B.Acceptance(tuple(vals))


def inputs(a: argparse.Namespace) -> B.Inputs:
    return B.Inputs(
        model=replace(B.ModelConfig(), gamma=a.gamma),
        hw=B.Hardware(bw_gbs=a.bw_gbs, link_gbps=a.link_gbps, rails=a.rails),
        seed=replace(B.SEED, moe_eff=a.moe_eff),
        draft_head_fp8=a.draft_head == "fp8",
        routing=a.routing,
        spin_budget_ms=a.spin_budget_ms,
    )


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        acc = acceptance(a)
    except ValueError as e:
        print(f"perf_model: {e}", file=sys.stderr)
        return EXIT_USAGE
    doc = report.build(
        inputs(a),
        acc,
        max_num_seqs=a.max_num_seqs,
        paging_ms=a.paging_m,
        mc_trials=a.mc_trials,
        mc_seed=a.mc_seed,
        tree_width=a.tree_width,
        per_seq_ms=a.per_seq_ms,
    )
    if a.nodes != 2:
        doc["group"] = G.build(inputs(a), a.nodes, a.fabric, a.allreduce, a.replicated_share)
    text = json.dumps(doc, indent=2)
    if a.json == "-":
        print(text)
        return EXIT_OK
    print(report.render(doc))
    if a.json:
        try:
            Path(a.json).write_text(text + "\n")
        except OSError as e:  # checked writable at start; the directory can still go away
            print(f"perf_model: cannot write --json {a.json}: {e.strerror or e}", file=sys.stderr)
            return EXIT_ERROR
        print(f"JSON written to {a.json}", file=sys.stderr)
    return EXIT_OK
