"""Context ladder: prefill tok/s, TTFT, decode tok/s and DSpark acceptance per prompt depth.

For each depth one streamed request per run carries a prompt of that many tokens (real-looking
prose calibrated with the server's /tokenize, a unique nonce first so the prefix cache cannot help)
and decodes --max-tokens tokens. Every wave is guarded against foreign traffic.

prefill_tok_s is latency-corrected: (P - P0) / (TTFT - TTFT0), where P0, TTFT0 come from a tiny
baseline prompt measured in the same run (median of --baseline-requests). That removes the fixed
per-request cost (HTTP, queueing, the first step) and keeps everything that grows with the prompt:
server-side tokenization and every prefill chunk step. It is the rate a user sees, and lower than
the engine's marginal kernel rate. prefill_naive_tok_s = P / TTFT is reported too.

Example: python -m bench.bench_ctx --url http://HOST:8000 --depths 1k,4k,16k,64k,128k
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any

from bench.benchlib import cli, prompts, report
from bench.benchlib.guard import GuardedPoint, InFlightTracker
from bench.benchlib.results import Point, PointSummary, clean_metrics, summarize_points
from bench.benchlib.runner import Bench
from bench.benchlib.stats import median, request_metrics
from pairctl.cli import argtypes

KEYS = (
    "ttft_ms",
    "prefill_tok_s",
    "prefill_naive_tok_s",
    "decode_tok_s",
    "tpot_ms",
    "mean_accept_len",
    "prompt_tokens",
)
HEADERS = [
    "depth",
    "prompt_tok",
    "ttft_ms",
    "prefill_tok_s",
    "decode_tok_s",
    "accept_len",
    "accept_by_pos",
    "retries",
    "status",
]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    pos = argtypes.int_at_least(1)
    p.add_argument(
        "--depths",
        type=argtypes.size_list,
        default="1k,4k,16k,64k,128k",
        help="prompt depths (tokens; 4k = 4096)",
    )
    p.add_argument("--max-tokens", type=pos, default=256, help="tokens decoded per request")
    p.add_argument("--baseline-tokens", type=pos, default=32, help="prompt of the TTFT baseline")
    p.add_argument("--baseline-requests", type=pos, default=3, help="baseline TTFT = median of")


def parse_args(argv: argparse.Namespace | list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    args, p = cli.parse(argv, __doc__, __spec__.name, add_cli_args)
    return args, list(args.depths)


# ---- measuring ------------------------------------------------------------------------------
class Ladder:
    """The prompts of every depth, calibrated once, and the guarded waves that send them."""

    def __init__(self, b: Bench, depths: list[int]) -> None:
        self.b, self.args = b, b.args
        seed = b.args.seed
        self.rng = random.Random(seed)
        self.texts: dict[int, str] = {}
        for d in [b.args.baseline_tokens, *depths]:
            self.texts[d], measured = prompts.calibrated_text(d, self._count, seed=seed + d)
            if measured is None:
                why = "server has no /tokenize; length estimated (usage is the truth)"
                cli.log(f"depth {d}: {why}")

    def _count(self, text: str) -> int | None:
        b = self.b
        msgs = prompts.messages_for(text, "[ref 00000000] ")
        return prompts.count_tokens(b.session, b.endpoint, b.model, msgs)

    def depth(self, depth: int) -> tuple[GuardedPoint, dict[str, Any] | None]:
        """One request at this depth; per-position acceptance from the clean wave's deltas."""

        def wave(tr: InFlightTracker):
            # A fresh nonce per attempt: a retry must not hit the prefix cache of the last one.
            msgs = prompts.messages_for(self.texts[depth], prompts.nonce(self.rng))
            return self.b.stream(self.b.chat_payload(msgs, self.args.max_tokens), tr)

        gp = self.b.guarded(f"depth {depth}", wave)
        m = request_metrics(gp.result) if gp.result is not None else None
        if m is not None and gp.deltas is not None:
            m["mean_accept_len"] = gp.deltas["mean_accept_len"]
            m["accept_rate_pos"] = gp.deltas["accept_rate_pos"]
        return gp, m

    def baseline(self) -> tuple[GuardedPoint, dict[str, Any] | None]:
        """Median TTFT of a few tiny requests (one wave): the fixed cost to subtract."""
        text = self.texts[self.args.baseline_tokens]

        def wave(tr: InFlightTracker):
            return [
                self.b.stream(
                    self.b.chat_payload(prompts.messages_for(text, prompts.nonce(self.rng)), 4), tr
                )
                for _ in range(self.args.baseline_requests)
            ]

        gp = self.b.guarded("baseline", wave)
        if gp.result is None:
            return gp, None
        ms = [request_metrics(r) for r in gp.result]
        errs = [m["error"] for m in ms if m["error"]]
        return gp, {
            "error": errs[0] if errs else None,
            "ttft_ms": median(m["ttft_ms"] for m in ms),
            "prompt_tokens": median(m["prompt_tokens"] for m in ms),
            "ttft_ms_each": [m["ttft_ms"] for m in ms],
            "request_ids": [m["request_id"] for m in ms],
        }


def add_prefill_rates(m: dict[str, Any], base: dict[str, Any] | None) -> None:
    """Fill prefill_naive_tok_s = P / TTFT and prefill_tok_s = (P - P0) / (TTFT - TTFT0).

    prefill_tok_s stays None without a clean baseline or when TTFT is not above the baseline's.
    """
    P, t = m["prompt_tokens"], m["ttft_ms"]
    m["prefill_naive_tok_s"] = P / (t / 1000) if P and t else None
    m["prefill_tok_s"] = None
    if base is not None and P and base["prompt_tokens"] is not None and t > base["ttft_ms"]:
        m["prefill_tok_s"] = (P - base["prompt_tokens"]) / ((t - base["ttft_ms"]) / 1000)


def run(b: Bench, depths: list[int]) -> dict[int, list[Point]]:
    """Per run: the baseline wave, then one wave per depth. Returns the points per depth."""
    args = b.args
    ladder = Ladder(b, depths)
    bar = b.progress(args.runs * (len(depths) + 1), "bench_ctx")
    per_depth: dict[int, list[Point]] = {d: [] for d in depths}
    for r in range(args.runs):
        gp0, m0 = ladder.baseline()
        b.results.add(
            f"baseline run{r}", gp0, m0, depth=args.baseline_tokens, run=r, role="baseline"
        )
        bar.update()
        base = m0 if gp0.status == "ok" and m0 is not None and not m0["error"] else None
        for d in depths:
            gp, m = ladder.depth(d)
            if m is not None and not m["error"]:
                add_prefill_rates(m, base)
            pt = b.results.add(f"depth {d} run{r}", gp, m, depth=d, run=r, role="measure")
            per_depth[d].append(pt)
            bar.update()
    bar.close()
    return per_depth


# ---- summary and report ---------------------------------------------------------------------
@dataclass
class CtxSummary:
    """One row per depth: medians over runs, per-position acceptance, tally."""

    depths: dict[int, PointSummary]

    def to_json(self) -> dict[str, Any]:
        return {str(d): s.to_json() for d, s in self.depths.items()}


def summarize_ladder(per_depth: dict[int, list[Point]]) -> CtxSummary:
    rows: dict[int, PointSummary] = {}
    for d, pts in per_depth.items():
        s = summarize_points(pts, KEYS)
        pos = [m["accept_rate_pos"] for m in clean_metrics(pts) if m.get("accept_rate_pos")]
        s.extra["accept_rate_pos_median"] = (
            [median(col) for col in zip(*pos, strict=False)] if pos else None
        )
        rows[d] = s
    return CtxSummary(rows)


def print_report(summary: CtxSummary, runs: int) -> None:
    rows = []
    for d, s in summary.depths.items():
        accept, by_pos = s.median("mean_accept_len"), s.extra["accept_rate_pos_median"]
        rows.append(
            [
                d,
                s.median("prompt_tokens"),
                s.median("ttft_ms"),
                s.median("prefill_tok_s"),
                s.median("decode_tok_s"),
                None if accept is None else f"{accept:.3f}",
                "/".join(f"{x:.2f}" for x in by_pos) if by_pos else None,
                s.tally.retries,
                s.tally.status,
            ]
        )
    print(report.table(rows, HEADERS))
    print(f"(median of {runs} run(s); acceptance from /metrics deltas of clean waves)")


def plot(path: str, summary: CtxSummary, model: str) -> None:
    depths = list(summary.depths)

    def series(key: str) -> list[float | None]:
        return [summary.depths[d].median(key) for d in depths]

    panels = [
        ("decode tok/s", {"decode": series("decode_tok_s")}),
        ("prefill tok/s", {"prefill": series("prefill_tok_s")}),
        ("TTFT ms", {"ttft": series("ttft_ms")}),
    ]
    report.plot(path, depths, panels, "prompt depth (tokens)", f"bench_ctx {model}", logx=True)


def too_deep(depths: list[int], max_tokens: int, max_model_len: int | None) -> str | None:
    """Why the server cannot take the deepest prompt (None when it can, or is not known)."""
    if max_model_len is None:
        return None
    over = [d for d in depths if d + max_tokens > max_model_len]
    if not over:
        return None
    return (
        f"--depths {','.join(map(str, over))} plus --max-tokens {max_tokens} exceed the "
        f"server's max_model_len {max_model_len} (GET /v1/models); use depths up to "
        f"{max_model_len - max_tokens} (a prompt's chat template adds a few tokens too)"
    )


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, depths = parse_args(argv)
    b = Bench("bench_ctx", args)

    def body() -> int:
        b.prepare(lambda: too_deep(depths, args.max_tokens, b.max_model_len))
        summary = summarize_ladder(run(b, depths))
        print_report(summary, args.runs)
        if args.plot:
            plot(args.plot, summary, b.model)
        return b.finish(summary.to_json())

    return b.run(body)


if __name__ == "__main__":
    cli.entry(main)
