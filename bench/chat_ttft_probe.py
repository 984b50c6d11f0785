#!/usr/bin/env python3
"""Multi-turn TTFT: a growing conversation that re-sends the whole history every turn.

This is what chat clients do, and the metric the incremental tokenizer cache moves: with a plain
tokenizer every turn re-encodes the whole (growing) history before prefill can start. Each turn is
one guarded wave; TTFT is measured to the first content or reasoning token (never the role-only
chunk); ttft_content_ms, to the first answer token, is reported as well.

The conversation starts with a unique nonce (no cache from earlier runs). A retried turn gets an
"(attempt k)" tag in its newest user message only, so its prefix-cache situation is the same as the
discarded attempt's first try: the history is cached, the new message is not.

Example: python3 bench/chat_ttft_probe.py --url http://HOST:8000 --turns 10 --turn-tokens 2k
"""

from __future__ import annotations

import random
import sys
from typing import Any

from bench.benchlib import cli, prompts
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.stats import median, request_metrics, summarize


def main(argv: list[str] | None = None) -> int:
    p = cli.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=8, help="conversation turns")
    p.add_argument("--first-tokens", default="4k", help="size of the first user message")
    p.add_argument("--turn-tokens", default="1k", help="size of each later user message")
    p.add_argument("--max-tokens", type=int, default=64, help="reply length per turn")
    args = p.parse_args(argv)
    if args.turns < 1 or args.runs < 1:
        p.error("--turns and --runs must be >= 1")
    first_n = prompts.parse_size(args.first_tokens)
    turn_n = prompts.parse_size(args.turn_tokens)

    b = cli.Bench("chat_ttft_probe", args)
    b.prepare()
    rng = random.Random(args.seed)

    bar = b.progress(args.turns * args.runs, "chat_ttft_probe")
    by_turn: dict[int, list[dict[str, Any]]] = {t: [] for t in range(args.turns)}
    run_medians: list[float | None] = []
    for run in range(args.runs):
        history: list[dict[str, str]] = []
        ttfts: list[float | None] = []
        for turn in range(args.turns):
            n_words = int((first_n if turn == 0 else turn_n) / 1.3)
            body = prompts.prose(n_words, seed=args.seed * 1000 + run * 100 + turn)
            tag = prompts.nonce(rng) if turn == 0 else ""
            question = f"{tag}{body}\n\nWhat stands out in these notes?"
            attempt = [0]

            def wave(
                tr: InFlightTracker,
                question: str = question,
                attempt: list[int] = attempt,
                history: list[dict[str, str]] = history,
            ) -> Any:
                k = attempt[0]
                attempt[0] += 1
                q = question if k == 0 else f"(attempt {k}) {question}"
                msgs = [*history, {"role": "user", "content": q}]
                return b.stream(b.chat_payload(msgs, args.max_tokens, fixed_length=False), tr), q

            gp = b.guarded(f"run{run} turn{turn}", wave)
            m = None
            if gp.result is not None:
                r, q = gp.result
                m = request_metrics(r)
                history += [
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": r.content or "OK."},
                ]
            pt = b.add_point(f"run{run} turn{turn}", gp, m, run=run, turn=turn)
            by_turn[turn].append(pt)
            ttfts.append(m["ttft_ms"] if pt["status"] == "ok" else None)
            bar.update()
            if gp.result is None:
                cli.log(f"run{run}: conversation stopped at turn {turn} (no clean wave)")
                break
        run_medians.append(median(ttfts))
    bar.close()

    rows = []
    summary: dict[str, Any] = {"turns": {}}
    for turn, pts in by_turn.items():
        ok = [pt["metrics"] for pt in pts if pt["status"] == "ok"]
        if not pts:
            continue
        s = {
            "ttft_ms": summarize(m["ttft_ms"] for m in ok),
            "ttft_content_ms": summarize(m["ttft_content_ms"] for m in ok),
            "prompt_tokens": summarize(m["prompt_tokens"] for m in ok),
            "retries": sum(pt["retries"] for pt in pts),
            "status": "ok" if len(ok) == len(pts) else pts[-1]["status"],
        }
        summary["turns"][str(turn)] = s
        rows.append(
            [
                turn,
                s["prompt_tokens"]["median"],
                s["ttft_ms"]["median"],
                s["ttft_content_ms"]["median"],
                s["retries"],
                s["status"],
            ]
        )
    all_ttft = [
        pt["metrics"]["ttft_ms"] for pts in by_turn.values() for pt in pts if pt["status"] == "ok"
    ]
    summary["ttft_ms"] = summarize(all_ttft)
    summary["median_ttft_ms_per_run"] = run_medians
    print(
        cli.table(rows, ["turn", "prompt_tok", "ttft_ms", "ttft_content_ms", "retries", "status"])
    )
    print(
        f"median TTFT over all turns: {cli.fmt(summary['ttft_ms']['median'])} ms "
        f"(p90 {cli.fmt(summary['ttft_ms']['p90'])} ms, {len(all_ttft)} turns)"
    )
    if args.plot:
        turns = list(summary["turns"])
        cli.plot(
            args.plot,
            [int(t) for t in turns],
            [
                (
                    "TTFT ms",
                    {
                        "ttft (first token)": [
                            summary["turns"][t]["ttft_ms"]["median"] for t in turns
                        ]
                    },
                )
            ],
            "turn",
            f"chat_ttft_probe {b.model}",
        )
    return cli.finish(b, summary)


if __name__ == "__main__":
    sys.exit(main())
