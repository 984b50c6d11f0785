"""Concurrency sweep: per-request decode tok/s and aggregate tok/s per concurrency level.

Each wave starts C identical streams at once (one thread each, blocking in recv). The rates come
from the steady window: from the moment the last stream that is decoding together with the others
produced its first token, to the moment the first stream finished. Ramp-up (prefills, queueing)
and ramp-down (streams finishing) are outside it, which is why per_req_decode_tok_s — not the
whole-wave aggregate — is the number to compare across levels.

Above the server's --max-num-seqs the extra streams wait; they start after the window has closed,
so `active` (streams decoding in the window) saturates at max-num-seqs and aggregate_tok_s at the
server's ceiling.

Example: python -m bench.bench_conc --url http://HOST:8000 --concurrency 1,2,4,8,16,24,32
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any

from bench.benchlib import MAX_CONCURRENCY, cli, prompts, report
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.response import StreamResult
from bench.benchlib.results import Point, PointSummary, clean_metrics, summarize_points
from bench.benchlib.runner import Bench
from bench.benchlib.stats import NS_PER_S, median, request_metrics, summarize, window_rate
from pairctl.cli import argtypes

KEYS = ("per_req_decode_tok_s", "aggregate_tok_s", "aggregate_wave_tok_s", "active")
HEADERS = [
    "conc",
    "active",
    "ttft_ms",
    "per_req_decode_tok_s",
    "aggregate_tok_s",
    "aggregate_wave_tok_s",
    "retries",
    "status",
]


# A rate from two or three events is at the mercy of one chunk delivered late: seen on a
# loaded 2-core box, a window of a few ms gave 2 tokens in 0.6 ms = 3215 tok/s for a stream
# decoding at 200. Fewer events than this in the window: no rate (null), never a wild one.
MIN_WINDOW_EVENTS = 4


def steady_window(results: list[StreamResult]) -> dict[str, Any]:
    """Window where the co-running streams all decode; rates of each stream inside it.

    end = first finish (min last-token time); the active set = streams whose first token came
    before `end`; start = the latest first token of the active set. Returns null rates when the
    window holds fewer than MIN_WINDOW_EVENTS token events for a stream.
    """
    none: dict[str, Any] = {
        "active": 0,
        "window_ms": None,
        "rates": [],
        "per_req_decode_tok_s": None,
        "aggregate_tok_s": None,
    }
    ok = [r for r in results if r.t_first_token_ns is not None and r.t_last_token_ns is not None]
    if not ok:
        return none
    end = min(r.t_last_token_ns for r in ok)
    active = [r for r in ok if r.t_first_token_ns < end]
    if not active:
        # The first stream to finish came in one read (its first token is its last: a reader
        # that lagged and found the whole answer buffered) and no other had started: no window.
        return none
    start = max(r.t_first_token_ns for r in active)
    rates = [window_rate(r, start, end, MIN_WINDOW_EVENTS)[0] for r in active]
    complete = None not in rates and end > start
    return {
        "active": len(active),
        "window_ms": (end - start) / 1e6 if end > start else None,
        "rates": rates,
        "per_req_decode_tok_s": median(rates) if complete else None,
        "aggregate_tok_s": sum(rates) if complete else None,  # type: ignore[arg-type]
    }


def wave_metrics(results: list[StreamResult]) -> dict[str, Any]:
    per = [request_metrics(r) for r in results]
    errors = [m["error"] for m in per if m["error"]]
    w = steady_window(results)
    t0 = min(r.t_request_ns or r.t_start_ns for r in results)
    t1 = max(r.t_last_token_ns or r.t_done_ns or t0 for r in results)
    toks = [r.completion_tokens for r in results]
    agg_wave = (
        sum(toks) / ((t1 - t0) / NS_PER_S) if None not in toks and t1 > t0 else None  # type: ignore[arg-type]
    )
    return {
        "error": f"{len(errors)} of {len(results)} requests failed: {errors[0]}"
        if errors
        else None,
        "concurrency": len(results),
        "active": w["active"],
        "window_ms": w["window_ms"],
        "per_req_decode_tok_s": w["per_req_decode_tok_s"],
        "aggregate_tok_s": w["aggregate_tok_s"],
        "aggregate_wave_tok_s": agg_wave,
        "ttft_ms": summarize(m["ttft_ms"] for m in per),
        "decode_tok_s_whole_stream": summarize(m["decode_tok_s"] for m in per),
        "window_rates_tok_s": w["rates"],
        "requests": per,
    }


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency",
        type=argtypes.int_list_at_most(MAX_CONCURRENCY),
        default="1,2,4,8,16,24,32",
        help=f"levels to sweep (comma-separated streams, each 1..{MAX_CONCURRENCY}: one "
        "thread and socket per stream)",
    )
    p.add_argument(
        "--max-tokens", type=argtypes.int_at_least(1), default=256, help="tokens decoded per stream"
    )
    p.add_argument(
        "--prompt-tokens",
        type=argtypes.int_at_least(1),
        default=128,
        help="prompt length per stream",
    )


def parse_args(argv: argparse.Namespace | list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    args, p = cli.parse(argv, __doc__, __spec__.name, add_cli_args)
    return args, list(args.concurrency)


def run(b: Bench, levels: list[int]) -> dict[int, list[Point]]:
    """Per run, one guarded wave of C streams per level. Returns the points per level."""
    args = b.args
    rng = random.Random(args.seed)
    text = prompts.prose(max(1, int(args.prompt_tokens / 1.3)), args.seed)

    def wave(tr: InFlightTracker, c: int) -> list[StreamResult]:
        # Fresh nonces per attempt, so a retry never rides the previous one's cache.
        payloads = [
            b.chat_payload(prompts.messages_for(text, prompts.nonce(rng)), args.max_tokens)
            for _ in range(c)
        ]
        return b.stream_wave(payloads, tr)

    bar = b.progress(len(levels) * args.runs, "bench_conc")
    by_level: dict[int, list[Point]] = {c: [] for c in levels}
    for r in range(args.runs):
        for c in levels:
            gp = b.guarded(f"c={c}", lambda tr, c=c: wave(tr, c))
            m = wave_metrics(gp.result) if gp.result is not None else None
            if m is not None and gp.deltas is not None:
                m["mean_accept_len"] = gp.deltas["mean_accept_len"]
            by_level[c].append(b.results.add(f"c={c} run{r}", gp, m, concurrency=c, run=r))
            bar.update()
    bar.close()
    return by_level


@dataclass
class ConcSummary:
    """One row per level (medians over runs, tally) and the best steady-window aggregate."""

    levels: dict[int, PointSummary]
    aggregate_ceiling_tok_s: float | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {str(c): s.to_json() for c, s in self.levels.items()}
        return out | {"aggregate_ceiling_tok_s": self.aggregate_ceiling_tok_s}

    def series(self, key: str) -> list[float | None]:
        return [s.median(key) for s in self.levels.values()]


def summarize_sweep(by_level: dict[int, list[Point]]) -> ConcSummary:
    rows: dict[int, PointSummary] = {}
    for c, pts in by_level.items():
        s = summarize_points(pts, KEYS)
        # A wave's TTFT is already a distribution over its streams: summarise their medians.
        s.stats["ttft_ms"] = summarize(m["ttft_ms"]["median"] for m in clean_metrics(pts))
        rows[c] = s
    agg = [s.median("aggregate_tok_s") for s in rows.values()]
    return ConcSummary(rows, max((a for a in agg if a is not None), default=None))


def print_report(summary: ConcSummary, runs: int) -> None:
    rows = [
        [
            c,
            s.median("active"),
            s.median("ttft_ms"),
            s.median("per_req_decode_tok_s"),
            s.median("aggregate_tok_s"),
            s.median("aggregate_wave_tok_s"),
            s.tally.retries,
            s.tally.status,
        ]
        for c, s in summary.levels.items()
    ]
    print(report.table(rows, HEADERS))
    best = report.fmt(summary.aggregate_ceiling_tok_s)
    print(f"aggregate ceiling: {best} tok/s (steady window; median of {runs} run(s))")


def plot(path: str, summary: ConcSummary, model: str) -> None:
    agg = {
        "steady window": summary.series("aggregate_tok_s"),
        "whole wave": summary.series("aggregate_wave_tok_s"),
    }
    per_req = {"per_req_decode": summary.series("per_req_decode_tok_s")}
    panels = [("aggregate tok/s", agg), ("per-request tok/s", per_req)]
    report.plot(path, list(summary.levels), panels, "concurrent streams", f"bench_conc {model}")


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, levels = parse_args(argv)
    b = Bench("bench_conc", args)

    def body() -> int:
        b.prepare()
        summary = summarize_sweep(run(b, levels))
        print_report(summary, args.runs)
        if args.plot:
            plot(args.plot, summary, b.model)
        return b.finish(summary.to_json())

    return b.run(body)


if __name__ == "__main__":
    cli.entry(main)
