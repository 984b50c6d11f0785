#!/usr/bin/env python3
"""Concurrency sweep: per-request decode tok/s and aggregate tok/s per concurrency level.

Each wave starts C identical streams at once (one thread each, blocking in recv). The rates come
from the steady window: from the moment the last stream that is decoding together with the others
produced its first token, to the moment the first stream finished. Ramp-up (prefills, queueing)
and ramp-down (streams finishing) are outside it, which is why per_req_decode_tok_s — not the
whole-wave aggregate — is the number to compare across levels.

Above the server's --max-num-seqs the extra streams wait; they start after the window has closed,
so `active` (streams decoding in the window) saturates at max-num-seqs and aggregate_tok_s at the
server's ceiling.

Example: python3 bench/bench_conc.py --url http://HOST:8000 --concurrency 1,2,4,8,16,24,32
"""

from __future__ import annotations

import random
import sys
from typing import Any

from bench.benchlib import cli, prompts
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.stats import NS_PER_S, median, request_metrics, summarize, window_rate
from bench.benchlib.stream import StreamResult


def steady_window(results: list[StreamResult]) -> dict[str, Any]:
    """Window where the co-running streams all decode; rates of each stream inside it.

    end = first finish (min last-token time); the active set = streams whose first token came
    before `end`; start = the latest first token of the active set. Returns null rates when the
    window holds < 2 token events for a stream.
    """
    ok = [r for r in results if r.t_first_token_ns is not None and r.t_last_token_ns is not None]
    if not ok:
        return {
            "active": 0,
            "window_ms": None,
            "rates": [],
            "per_req_decode_tok_s": None,
            "aggregate_tok_s": None,
        }
    end = min(r.t_last_token_ns for r in ok)
    active = [r for r in ok if r.t_first_token_ns < end]
    start = max(r.t_first_token_ns for r in active)
    rates = [window_rate(r, start, end)[0] for r in active]
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


def main(argv: list[str] | None = None) -> int:
    p = cli.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,24,32", help="levels to sweep")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens decoded per stream")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length per stream")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or args.runs < 1:
        p.error("--concurrency needs positive integers, --runs >= 1")

    b = cli.Bench("bench_conc", args)
    b.prepare()
    rng = random.Random(args.seed)
    text = prompts.prose(max(1, int(args.prompt_tokens / 1.3)), args.seed)

    bar = b.progress(len(levels) * args.runs, "bench_conc")
    by_level: dict[int, list[dict[str, Any]]] = {c: [] for c in levels}
    for run in range(args.runs):
        for c in levels:

            def wave(tr: InFlightTracker, c: int = c) -> list[StreamResult]:
                # Fresh nonces per attempt, so a retry never rides the previous one's cache.
                payloads = [
                    b.chat_payload(prompts.messages_for(text, prompts.nonce(rng)), args.max_tokens)
                    for _ in range(c)
                ]
                return b.stream_wave(payloads, tr)

            gp = b.guarded(f"c={c}", wave)
            m = wave_metrics(gp.result) if gp.result is not None else None
            if m is not None and gp.deltas is not None:
                m["mean_accept_len"] = gp.deltas["mean_accept_len"]
            by_level[c].append(b.add_point(f"c={c} run{run}", gp, m, concurrency=c, run=run))
            bar.update()
    bar.close()

    keys = ("per_req_decode_tok_s", "aggregate_tok_s", "aggregate_wave_tok_s", "active")
    summary: dict[str, Any] = {}
    rows = []
    for c in levels:
        ok = [pt["metrics"] for pt in by_level[c] if pt["status"] == "ok"]
        s: dict[str, Any] = {k: summarize(m[k] for m in ok) for k in keys}
        s["ttft_ms"] = summarize(m["ttft_ms"]["median"] for m in ok)
        s["runs_ok"] = len(ok)
        s["retries"] = sum(pt["retries"] for pt in by_level[c])
        s["status"] = "ok" if len(ok) == args.runs else by_level[c][-1]["status"]
        summary[str(c)] = s
        rows.append(
            [
                c,
                s["active"]["median"],
                s["ttft_ms"]["median"],
                s["per_req_decode_tok_s"]["median"],
                s["aggregate_tok_s"]["median"],
                s["aggregate_wave_tok_s"]["median"],
                s["retries"],
                s["status"],
            ]
        )
    print(
        cli.table(
            rows,
            [
                "conc",
                "active",
                "ttft_ms",
                "per_req_decode_tok_s",
                "aggregate_tok_s",
                "aggregate_wave_tok_s",
                "retries",
                "status",
            ],
        )
    )
    agg = [summary[str(c)]["aggregate_tok_s"]["median"] for c in levels]
    best = max((a for a in agg if a is not None), default=None)
    summary["aggregate_ceiling_tok_s"] = best
    print(f"aggregate ceiling: {cli.fmt(best)} tok/s (steady window; median of {args.runs} run(s))")
    if args.plot:
        cli.plot(
            args.plot,
            levels,
            [
                (
                    "aggregate tok/s",
                    {
                        "steady window": agg,
                        "whole wave": [
                            summary[str(c)]["aggregate_wave_tok_s"]["median"] for c in levels
                        ],
                    },
                ),
                (
                    "per-request tok/s",
                    {
                        "per_req_decode": [
                            summary[str(c)]["per_req_decode_tok_s"]["median"] for c in levels
                        ]
                    },
                ),
            ],
            "concurrent streams",
            f"bench_conc {b.model}",
        )
    return cli.finish(b, summary)


if __name__ == "__main__":
    sys.exit(main())
