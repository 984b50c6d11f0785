#!/usr/bin/env python3
"""Context ladder: prefill tok/s, TTFT, decode tok/s and DSpark acceptance per prompt depth.

For each depth one streamed request per run carries a prompt of that many tokens (real-looking
prose calibrated with the server's /tokenize, a unique nonce first so the prefix cache cannot help)
and decodes --max-tokens tokens. Every wave is guarded against foreign traffic.

prefill_tok_s is latency-corrected: (P - P0) / (TTFT - TTFT0), where P0, TTFT0 come from a tiny
baseline prompt measured in the same run (median of --baseline-requests). That removes the fixed
per-request cost (HTTP, queueing, the first step) and keeps everything that grows with the prompt:
server-side tokenization and every prefill chunk step. It is the rate a user sees, and lower than
the engine's marginal kernel rate. prefill_naive_tok_s = P / TTFT is reported too.

Example: python3 bench/bench_ctx.py --url http://HOST:8000 --depths 1k,4k,16k,64k,128k
"""

from __future__ import annotations

import random
import sys

from bench.benchlib import cli, prompts
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.stats import median, request_metrics, summarize


def main(argv: list[str] | None = None) -> int:
    p = cli.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="1k,4k,16k,64k,128k", help="prompt depths (tokens)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens decoded per request")
    p.add_argument("--baseline-tokens", type=int, default=32, help="prompt of the TTFT baseline")
    p.add_argument("--baseline-requests", type=int, default=3, help="baseline TTFT = median of")
    args = p.parse_args(argv)
    depths = [prompts.parse_size(d) for d in args.depths.split(",") if d.strip()]
    if not depths or args.runs < 1:
        p.error("need at least one depth and --runs >= 1")

    b = cli.Bench("bench_ctx", args)
    b.prepare()
    rng = random.Random(args.seed)

    def counter(text: str) -> int | None:
        return prompts.count_tokens(
            b.session, b.url, b.model, prompts.messages_for(text, "[ref 00000000] ")
        )

    texts: dict[int, str] = {}
    for d in [args.baseline_tokens, *depths]:
        texts[d], measured = prompts.calibrated_text(d, counter, seed=args.seed + d)
        if measured is None:
            cli.log(f"depth {d}: server has no /tokenize; length estimated (usage is the truth)")

    def one(depth: int):
        def wave(tr: InFlightTracker):
            # A fresh nonce per attempt: a retry must not hit the prefix cache of the last one.
            msgs = prompts.messages_for(texts[depth], prompts.nonce(rng))
            return b.stream(b.chat_payload(msgs, args.max_tokens), tr)

        gp = b.guarded(f"depth {depth}", wave)
        m = request_metrics(gp.result) if gp.result is not None else None
        return gp, m

    def baseline():
        """Median TTFT of a few tiny requests (one wave): the fixed cost to subtract."""

        def wave(tr: InFlightTracker):
            return [
                b.stream(
                    b.chat_payload(
                        prompts.messages_for(texts[args.baseline_tokens], prompts.nonce(rng)), 4
                    ),
                    tr,
                )
                for _ in range(args.baseline_requests)
            ]

        gp = b.guarded("baseline", wave)
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

    bar = b.progress(args.runs * (len(depths) + 1), "bench_ctx")
    per_depth: dict[int, list[dict]] = {d: [] for d in depths}
    for run in range(args.runs):
        gp0, m0 = baseline()
        b.add_point(
            f"baseline run{run}", gp0, m0, depth=args.baseline_tokens, run=run, role="baseline"
        )
        bar.update()
        base_ok = gp0.status == "ok" and m0 is not None and not m0["error"]
        for d in depths:
            gp, m = one(d)
            if m is not None and gp.deltas is not None:
                m["mean_accept_len"] = gp.deltas["mean_accept_len"]
                m["accept_rate_pos"] = gp.deltas["accept_rate_pos"]
            if m is not None and not m["error"]:
                P, t = m["prompt_tokens"], m["ttft_ms"]
                m["prefill_naive_tok_s"] = P / (t / 1000) if P and t else None
                m["prefill_tok_s"] = None
                if base_ok and P and m0["prompt_tokens"] is not None and t > m0["ttft_ms"]:
                    m["prefill_tok_s"] = (P - m0["prompt_tokens"]) / ((t - m0["ttft_ms"]) / 1000)
            pt = b.add_point(f"depth {d} run{run}", gp, m, depth=d, run=run, role="measure")
            per_depth[d].append(pt)
            bar.update()
    bar.close()

    keys = (
        "ttft_ms",
        "prefill_tok_s",
        "prefill_naive_tok_s",
        "decode_tok_s",
        "tpot_ms",
        "mean_accept_len",
        "prompt_tokens",
    )
    summary: dict[str, dict] = {}
    rows = []
    for d in depths:
        ok = [pt["metrics"] for pt in per_depth[d] if pt["status"] == "ok"]
        s = {k: summarize(m.get(k) for m in ok) for k in keys}
        pos = [m["accept_rate_pos"] for m in ok if m.get("accept_rate_pos")]
        s["accept_rate_pos_median"] = (
            [median(col) for col in zip(*pos, strict=False)] if pos else None
        )
        s["runs_ok"] = len(ok)
        s["retries"] = sum(pt["retries"] for pt in per_depth[d])
        s["status"] = "ok" if len(ok) == args.runs else per_depth[d][-1]["status"]
        summary[str(d)] = s
        med = {k: s[k]["median"] for k in keys}
        rows.append(
            [
                d,
                med["prompt_tokens"],
                med["ttft_ms"],
                med["prefill_tok_s"],
                med["decode_tok_s"],
                None if med["mean_accept_len"] is None else f"{med['mean_accept_len']:.3f}",
                "/".join(f"{x:.2f}" for x in s["accept_rate_pos_median"])
                if s["accept_rate_pos_median"]
                else None,
                s["retries"],
                s["status"],
            ]
        )
    print(
        cli.table(
            rows,
            [
                "depth",
                "prompt_tok",
                "ttft_ms",
                "prefill_tok_s",
                "decode_tok_s",
                "accept_len",
                "accept_by_pos",
                "retries",
                "status",
            ],
        )
    )
    print(f"(median of {args.runs} run(s); acceptance from /metrics deltas of clean waves)")
    if args.plot:
        cli.plot(
            args.plot,
            depths,
            [
                (
                    "decode tok/s",
                    {"decode": [summary[str(d)]["decode_tok_s"]["median"] for d in depths]},
                ),
                (
                    "prefill tok/s",
                    {"prefill": [summary[str(d)]["prefill_tok_s"]["median"] for d in depths]},
                ),
                ("TTFT ms", {"ttft": [summary[str(d)]["ttft_ms"]["median"] for d in depths]}),
            ],
            "prompt depth (tokens)",
            f"bench_ctx {b.model}",
            logx=True,
        )
    return cli.finish(b, summary)


if __name__ == "__main__":
    sys.exit(main())
