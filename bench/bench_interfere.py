"""Decode under prefill: a stream's decode tok/s alone, then while another request prefills.

Phase "solo": one decoding stream alone (guarded: the server must show only it).
Phase "under prefill": the same stream; after --lead-ms, a second request with a long prompt
(--prefill-tokens, max_tokens 1) is sent. Steps that carry a prefill chunk are longer: the run of
the decoding stream's gaps that exceed 1.5x its own earlier gap and ends at the long request's
first token is the interfered steps; decode_tok_s = tokens per event / their median (step_ms).
stall_ms is the longest gap of the decoding stream while the long request was pending.

This is the metric --long-prefill-token-threshold moves: without it a long prompt's prefill
chunks (up to --max-num-batched-tokens per step) make every step slow for the decoding stream.

Example: python -m bench.bench_interfere --url http://HOST:8000 --prefill-tokens 32k
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.benchlib import cli, prompts, report
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.response import StreamResult
from bench.benchlib.results import Point, PointSummary, summarize_points
from bench.benchlib.runner import Bench
from bench.benchlib.stats import NS_PER_S, chunk_token_counts, median, request_metrics
from pairctl.cli import argtypes

STRETCH = 1.5  # a step this much longer than the stream's solo gap is an interfered step
PHASES = ("solo", "under_prefill")
KEYS = ("decode_tok_s", "stall_ms", "prefill_ttft_ms")
HEADERS = ["phase", "decode_tok_s", "stall_ms", "prefill_ttft_ms", "retries", "status"]


def window_metrics(dec: StreamResult, sent_ns: int, first_ns: int) -> dict[str, Any]:
    """Decode rate of `dec` while the long request (sent at sent_ns, first token at first_ns)
    was being prefilled.

    Every engine step that carries a prefill chunk is longer, and those steps are contiguous and
    end with the long request's first token. So: walk back from the decoding stream's last event
    before first_ns over gaps longer than STRETCH x its median gap before sent_ns; that run is the
    interfered steps. decode_tok_s = tokens per event / the run's median gap (step_ms). The median
    ignores the odd gap that is not a full chunk step (a server-side stall while it tokenizes the
    long prompt, delivery jitter); the final, usually partial, chunk is left out unless the run
    would be shorter than 2 steps. With no stretched gap at all, all overlapping gaps are used.
    """
    ts = dec.token_chunk_ns
    counts = chunk_token_counts(dec)
    out: dict[str, Any] = {
        "decode_tok_s": None,
        "stall_ms": None,
        "step_ms": None,
        "stretched_steps": None,
        "itl_before_ms": None,
    }
    if len(ts) < 3 or not counts or first_ns <= sent_ns:
        return out
    ref = median([b - a for a, b in zip(ts, ts[1:], strict=False) if b <= sent_ns])
    over = [
        i for i in range(1, len(ts)) if ts[i] > sent_ns and ts[i - 1] < first_ns
    ]  # gaps (ending at event i) overlapping [sent, first]
    if ref is None or not over:
        return out

    def run_back(last: int) -> list[int]:
        run, i = [], last
        while i >= 1 and ts[i] > sent_ns and ts[i] - ts[i - 1] > STRETCH * ref:
            run.append(i)
            i -= 1
        return run

    before_last = [i for i in over if ts[i] < first_ns - ref / 2]
    run = run_back(before_last[-1]) if before_last else []
    if len(run) < 2:
        run = run_back(over[-1])
    use = run or over
    step = median(ts[i] - ts[i - 1] for i in use)
    per_event = sum(counts[i] for i in use) / len(use)
    out.update(
        decode_tok_s=per_event / (step / NS_PER_S),
        stall_ms=max(ts[i] - ts[i - 1] for i in over) / 1e6,
        step_ms=step / 1e6,
        stretched_steps=len(run),
        itl_before_ms=ref / 1e6,
    )
    return out


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefill-tokens",
        type=argtypes.size,
        default="32k",
        help="prompt of the interfering request (tokens; 32k = 32768)",
    )
    p.add_argument(
        "--decode-tokens",
        type=argtypes.int_at_least(3),
        default=1024,
        help="tokens of the decode stream (>= 3: the rate needs gaps)",
    )
    p.add_argument(
        "--lead-ms",
        type=argtypes.float_above(0.0),
        default=1500,
        help="decode alone before the prefill is sent (> 0)",
    )


def parse_args(argv: argparse.Namespace | list[str] | None) -> tuple[argparse.Namespace, int]:
    args, p = cli.parse(argv, __doc__, __spec__.name, add_cli_args)
    return args, args.prefill_tokens


def solo_metrics(o: dict[str, Any]) -> dict[str, Any]:
    m = request_metrics(o["decode"])
    return {"error": m["error"], "decode_tok_s": m["decode_tok_s"], "decode": m}


def interfered_metrics(o: dict[str, Any]) -> dict[str, Any]:
    """The decoding stream's rate while the long request prefilled, and the long one's TTFT."""
    dec, pre = o["decode"], o["prefill"]
    md, mp = request_metrics(dec), request_metrics(pre)
    err = md["error"] or mp["error"]
    w: dict[str, Any] = {
        "decode_tok_s": None,
        "stall_ms": None,
        "step_ms": None,
        "stretched_steps": None,
    }
    truncated = False
    if not err and pre.t_request_ns and pre.t_first_token_ns and dec.t_last_token_ns:
        end = min(pre.t_first_token_ns, dec.t_last_token_ns)
        truncated = dec.t_last_token_ns < pre.t_first_token_ns
        started = dec.t_first_token_ns is not None and dec.t_first_token_ns < pre.t_request_ns
        if not started:
            err = "decode stream had not started when the prefill was sent (raise --lead-ms)"
        else:
            w = window_metrics(dec, pre.t_request_ns, end)
            if w["decode_tok_s"] is None:  # a wave without its figure is not an "ok" point
                err = (
                    "no figure: the decoding stream had too few tokens while the prefill ran "
                    "to measure its rate (raise --decode-tokens or --prefill-tokens)"
                )
    if truncated:
        cli.log("warning: decode stream ended before the prefill did; raise --decode-tokens")
    return {
        "error": err,
        "decode_tok_s": w["decode_tok_s"],
        "stall_ms": w["stall_ms"],
        "step_ms": w["step_ms"],
        "window_truncated": truncated,
        "stretched_steps": w["stretched_steps"],
        "prefill_ttft_ms": mp["ttft_ms"],
        "prefill_prompt_tokens": mp["prompt_tokens"],
        "decode": md,
        "prefill": mp,
    }


class Waves:
    """The two guarded waves: the decoding stream alone, and with a long prefill beside it."""

    def __init__(self, b: Bench, n_prefill: int) -> None:
        self.b, self.args = b, b.args
        self.rng = random.Random(self.args.seed)
        self.short = prompts.prose(60, self.args.seed)
        self.long_text, _ = prompts.calibrated_text(n_prefill, self._count, seed=self.args.seed + 1)

    def _count(self, text: str) -> int | None:
        msgs = prompts.messages_for(text, "[ref 00000000] ")
        return prompts.count_tokens(self.b.session, self.b.endpoint, self.b.model, msgs)

    def _decode_payload(self) -> dict[str, Any]:
        msgs = prompts.messages_for(self.short, prompts.nonce(self.rng))
        return self.b.chat_payload(msgs, self.args.decode_tokens)

    def solo(self, tr: InFlightTracker) -> dict[str, Any]:
        return {"decode": self.b.stream(self._decode_payload(), tr)}

    def under_prefill(self, tr: InFlightTracker) -> dict[str, Any]:
        out: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: out.__setitem__("decode", self.b.stream(self._decode_payload(), tr))
        )
        t.start()
        time.sleep(self.args.lead_ms / 1000)
        msgs = prompts.messages_for(self.long_text, prompts.nonce(self.rng))
        out["prefill"] = self.b.stream(self.b.chat_payload(msgs, 1), tr)
        t.join()
        return out


def run(b: Bench, n_prefill: int) -> dict[str, list[Point]]:
    """Per run, the solo wave then the under-prefill wave. Returns the points per phase."""
    waves = Waves(b, n_prefill)
    measure = {
        "solo": (waves.solo, solo_metrics),
        "under_prefill": (waves.under_prefill, interfered_metrics),
    }
    bar = b.progress(2 * b.args.runs, "bench_interfere")
    res: dict[str, list[Point]] = {phase: [] for phase in PHASES}
    for r in range(b.args.runs):
        for phase in PHASES:
            wave, metrics = measure[phase]
            gp = b.guarded(f"{phase} run{r}", wave)
            m = metrics(gp.result) if gp.result is not None else None
            res[phase].append(b.results.add(f"{phase} run{r}", gp, m, phase=phase, run=r))
            bar.update()
    bar.close()
    return res


@dataclass
class InterfereSummary:
    """One row per phase (medians over runs, tally) and the under-prefill / solo ratio."""

    phases: dict[str, PointSummary]
    under_over_solo: float | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {p: s.to_json() for p, s in self.phases.items()}
        return out | {"under_over_solo": self.under_over_solo}


def summarize_phases(res: dict[str, list[Point]]) -> InterfereSummary:
    phases = {phase: summarize_points(pts, KEYS) for phase, pts in res.items()}
    solo, under = (phases[p].median("decode_tok_s") for p in PHASES)
    return InterfereSummary(phases, under / solo if solo and under is not None else None)


def print_report(summary: InterfereSummary, n_prefill: int) -> None:
    rows = [
        [
            phase,
            s.median("decode_tok_s"),
            s.median("stall_ms"),
            s.median("prefill_ttft_ms"),
            s.tally.retries,
            s.tally.status,
        ]
        for phase, s in summary.phases.items()
    ]
    print(report.table(rows, HEADERS))
    ratio = report.fmt(summary.under_over_solo, 3)
    print(f"decode under prefill / solo: {ratio} (prefill {n_prefill} tokens)")


def plot(path: str, summary: InterfereSummary, model: str, n_prefill: int) -> None:
    medians = [s.median("decode_tok_s") for s in summary.phases.values()]
    title = f"bench_interfere {model} (prefill {n_prefill} tok)"
    report.bars(path, list(summary.phases), medians, "decode tok/s (median)", title)


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, n_prefill = parse_args(argv)
    b = Bench("bench_interfere", args)

    def body() -> int:
        b.prepare()
        summary = summarize_phases(run(b, n_prefill))
        print_report(summary, n_prefill)
        if args.plot:
            plot(args.plot, summary, b.model, n_prefill)
        return b.finish(summary.to_json())

    return b.run(body)


if __name__ == "__main__":
    cli.entry(main)
