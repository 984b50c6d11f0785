"""Multi-turn TTFT: a growing conversation that re-sends the whole history every turn.

This is what chat clients do, and the metric the incremental tokenizer cache moves: with a plain
tokenizer every turn re-encodes the whole (growing) history before prefill can start. Each turn is
one guarded wave; TTFT is measured to the first content or reasoning token (never the role-only
chunk); ttft_content_ms, to the first answer token, is reported as well.

The conversation starts with a unique nonce (no cache from earlier runs). A retried turn gets an
"(attempt k)" tag in its newest user message only, so its prefix-cache situation is the same as the
discarded attempt's first try: the history is cached, the new message is not.

Example: python -m bench.chat_ttft_probe --url http://HOST:8000 --turns 10 --turn-tokens 2k
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
from bench.benchlib.stats import median, request_metrics, summarize
from pairctl.cli import argtypes

KEYS = ("ttft_ms", "ttft_content_ms", "prompt_tokens")
HEADERS = ["turn", "prompt_tok", "ttft_ms", "ttft_content_ms", "retries", "status"]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    pos = argtypes.int_at_least(1)
    p.add_argument("--turns", type=pos, default=8, help="conversation turns")
    p.add_argument(
        "--first-tokens", type=argtypes.size, default="4k", help="size of the first user message"
    )
    p.add_argument(
        "--turn-tokens", type=argtypes.size, default="1k", help="size of each later user message"
    )
    p.add_argument("--max-tokens", type=pos, default=64, help="reply length per turn")


def parse_args(argv: argparse.Namespace | list[str] | None) -> tuple[argparse.Namespace, int, int]:
    """The flags, then the sizes of the first and of each later user message (tokens)."""
    args, p = cli.parse(argv, __doc__, __spec__.name, add_cli_args)
    return args, args.first_tokens, args.turn_tokens


def ask(b: Bench, history: list[dict[str, str]], question: str, label: str) -> GuardedPoint:
    """One turn as a guarded wave; a retry tags only the new message (history stays cached).

    The clean wave's result is (StreamResult, the question as sent).
    """
    attempt = [0]

    def wave(tr: InFlightTracker) -> Any:
        k = attempt[0]
        attempt[0] += 1
        q = question if k == 0 else f"(attempt {k}) {question}"
        msgs = [*history, {"role": "user", "content": q}]
        return b.stream(b.chat_payload(msgs, b.args.max_tokens, fixed_length=False), tr), q

    return b.guarded(label, wave)


@dataclass
class Conversations:
    """The points of every turn (over runs) and each run's median TTFT."""

    by_turn: dict[int, list[Point]]
    run_medians: list[float | None]


def run(b: Bench, first_n: int, turn_n: int) -> Conversations:
    """Per run, one conversation of --turns turns; it stops at a turn with no clean wave."""
    args = b.args
    rng = random.Random(args.seed)
    bar = b.progress(args.turns * args.runs, "chat_ttft_probe")
    conv = Conversations({t: [] for t in range(args.turns)}, [])
    for r in range(args.runs):
        history: list[dict[str, str]] = []
        ttfts: list[float | None] = []
        for turn in range(args.turns):
            n_words = int((first_n if turn == 0 else turn_n) / 1.3)
            body = prompts.prose(n_words, seed=args.seed * 1000 + r * 100 + turn)
            tag = prompts.nonce(rng) if turn == 0 else ""
            question = f"{tag}{body}\n\nWhat stands out in these notes?"
            gp = ask(b, history, question, f"run{r} turn{turn}")
            m = None
            if gp.result is not None:
                res, q = gp.result
                m = request_metrics(res)
                history += [
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": res.content or "OK."},
                ]
            pt = b.results.add(f"run{r} turn{turn}", gp, m, run=r, turn=turn)
            conv.by_turn[turn].append(pt)
            ttfts.append(m["ttft_ms"] if pt["status"] == "ok" else None)
            bar.update()
            if gp.result is None:
                cli.log(f"run{r}: conversation stopped at turn {turn} (no clean wave)")
                break
        conv.run_medians.append(median(ttfts))
    bar.close()
    return conv


@dataclass
class ChatSummary:
    """One row per turn reached (medians over runs, tally) and TTFT over all turns."""

    turns: dict[int, PointSummary]
    ttft_ms: dict[str, Any]  # stats.summarize() over every clean turn of every run
    median_ttft_ms_per_run: list[float | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": {str(t): s.to_json(runs_ok=False) for t, s in self.turns.items()},
            "ttft_ms": self.ttft_ms,
            "median_ttft_ms_per_run": self.median_ttft_ms_per_run,
        }


def summarize_conversations(conv: Conversations) -> ChatSummary:
    turns = {t: summarize_points(pts, KEYS) for t, pts in conv.by_turn.items() if pts}
    all_ttft = [m["ttft_ms"] for pts in conv.by_turn.values() for m in clean_metrics(pts)]
    return ChatSummary(turns, summarize(all_ttft), conv.run_medians)


def print_report(summary: ChatSummary) -> None:
    rows = [
        [
            t,
            s.median("prompt_tokens"),
            s.median("ttft_ms"),
            s.median("ttft_content_ms"),
            s.tally.retries,
            s.tally.status,
        ]
        for t, s in summary.turns.items()
    ]
    print(report.table(rows, HEADERS))
    all_ttft = summary.ttft_ms
    print(
        f"median TTFT over all turns: {report.fmt(all_ttft['median'])} ms "
        f"(p90 {report.fmt(all_ttft['p90'])} ms, {all_ttft['n']} turns)"
    )


def plot(path: str, summary: ChatSummary, model: str) -> None:
    ttft = {"ttft (first token)": [s.median("ttft_ms") for s in summary.turns.values()]}
    report.plot(path, list(summary.turns), [("TTFT ms", ttft)], "turn", f"chat_ttft_probe {model}")


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, first_n, turn_n = parse_args(argv)
    b = Bench("chat_ttft_probe", args)

    def body() -> int:
        b.prepare()
        summary = summarize_conversations(run(b, first_n, turn_n))
        print_report(summary)
        if args.plot:
            plot(args.plot, summary, b.model)
        return b.finish(summary.to_json())

    return b.run(body)


if __name__ == "__main__":
    cli.entry(main)
