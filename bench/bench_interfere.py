#!/usr/bin/env python3
"""Decode under prefill: a stream's decode tok/s alone, then while another request prefills.

Phase "solo": one decoding stream alone (guarded: the server must show only it).
Phase "under prefill": the same stream; after --lead-ms, a second request with a long prompt
(--prefill-tokens, max_tokens 1) is sent. The interference window is from that request being sent
to its first token (its prefill done). decode_tok_s in the window counts the decoding stream's
tokens arriving inside it, divided by its length — a stall shows as a low number (0.0 is a real,
measured total stall here, not a missing value). stall_ms is the longest gap between the decoding
stream's events that overlaps the window.

This is the metric --long-prefill-token-threshold moves: without it a long prompt's prefill
chunks (up to --max-num-batched-tokens per step) make every step slow for the decoding stream.

Example: python3 bench/bench_interfere.py --url http://HOST:8000 --prefill-tokens 32k
"""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any

from benchlib import cli, prompts
from benchlib.guard import InFlightTracker
from benchlib.stats import NS_PER_S, chunk_token_counts, request_metrics, summarize
from benchlib.stream import StreamResult


def window_metrics(dec: StreamResult, a_ns: int, b_ns: int) -> dict[str, Any]:
    """Tokens of the decoding stream arriving in (a, b] / (b - a), and the longest gap over it."""
    ts = dec.token_chunk_ns
    counts = chunk_token_counts(dec)
    if not ts or not counts or b_ns <= a_ns:
        return {"decode_tok_s": None, "stall_ms": None, "window_ms": None, "tokens": None}
    toks = sum(c for t, c in zip(ts, counts, strict=True) if a_ns < t <= b_ns)
    gaps = [
        (t1 - t0) / 1e6
        for t0, t1 in zip(ts, ts[1:], strict=False)
        if t1 > a_ns and t0 < b_ns  # the gap overlaps the window
    ]
    return {
        "decode_tok_s": toks / ((b_ns - a_ns) / NS_PER_S),
        "stall_ms": max(gaps) if gaps else (b_ns - a_ns) / 1e6,
        "window_ms": (b_ns - a_ns) / 1e6,
        "tokens": toks,
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--prefill-tokens", default="32k", help="prompt of the interfering request")
    p.add_argument("--decode-tokens", type=int, default=1024, help="tokens of the decode stream")
    p.add_argument("--lead-ms", type=float, default=1500, help="decode alone before the prefill")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs >= 1")
    n_prefill = prompts.parse_size(args.prefill_tokens)

    b = cli.Bench("bench_interfere", args)
    b.prepare()
    rng = random.Random(args.seed)
    short = prompts.prose(60, args.seed)

    def counter(text: str) -> int | None:
        msgs = prompts.messages_for(text, "[ref 00000000] ")
        return prompts.count_tokens(b.session, b.url, b.model, msgs)

    long_text, _ = prompts.calibrated_text(n_prefill, counter, seed=args.seed + 1)

    def decode_payload() -> dict[str, Any]:
        return b.chat_payload(prompts.messages_for(short, prompts.nonce(rng)), args.decode_tokens)

    def solo(tr: InFlightTracker) -> dict[str, Any]:
        return {"decode": b.stream(decode_payload(), tr)}

    def interfered(tr: InFlightTracker) -> dict[str, Any]:
        out: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: out.__setitem__("decode", b.stream(decode_payload(), tr))
        )
        t.start()
        time.sleep(args.lead_ms / 1000)
        msgs = prompts.messages_for(long_text, prompts.nonce(rng))
        out["prefill"] = b.stream(b.chat_payload(msgs, 1), tr)
        t.join()
        return out

    def solo_metrics(o: dict[str, Any]) -> dict[str, Any]:
        m = request_metrics(o["decode"])
        return {"error": m["error"], "decode_tok_s": m["decode_tok_s"], "decode": m}

    def interfered_metrics(o: dict[str, Any]) -> dict[str, Any]:
        dec, pre = o["decode"], o["prefill"]
        md, mp = request_metrics(dec), request_metrics(pre)
        err = md["error"] or mp["error"]
        w: dict[str, Any] = {"decode_tok_s": None, "stall_ms": None, "window_ms": None}
        truncated = False
        if not err and pre.t_request_ns and pre.t_first_token_ns and dec.t_last_token_ns:
            end = min(pre.t_first_token_ns, dec.t_last_token_ns)
            truncated = dec.t_last_token_ns < pre.t_first_token_ns
            started = dec.t_first_token_ns is not None and dec.t_first_token_ns < pre.t_request_ns
            if not started:
                err = "decode stream had not started when the prefill was sent (raise --lead-ms)"
            else:
                w = window_metrics(dec, pre.t_request_ns, end)
        if truncated:
            cli.log("warning: decode stream ended before the prefill did; raise --decode-tokens")
        return {
            "error": err,
            "decode_tok_s": w["decode_tok_s"],
            "stall_ms": w["stall_ms"],
            "window_ms": w["window_ms"],
            "window_truncated": truncated,
            "prefill_ttft_ms": mp["ttft_ms"],
            "prefill_prompt_tokens": mp["prompt_tokens"],
            "decode": md,
            "prefill": mp,
        }

    bar = b.progress(2 * args.runs, "bench_interfere")
    res: dict[str, list[dict[str, Any]]] = {"solo": [], "under_prefill": []}
    for run in range(args.runs):
        gp = b.guarded(f"solo run{run}", solo)
        m = solo_metrics(gp.result) if gp.result is not None else None
        res["solo"].append(b.add_point(f"solo run{run}", gp, m, phase="solo", run=run))
        bar.update()
        gp = b.guarded(f"under_prefill run{run}", interfered)
        m = interfered_metrics(gp.result) if gp.result is not None else None
        pt = b.add_point(f"under_prefill run{run}", gp, m, phase="under_prefill", run=run)
        res["under_prefill"].append(pt)
        bar.update()
    bar.close()

    summary: dict[str, Any] = {}
    rows = []
    for phase, pts in res.items():
        ok = [pt["metrics"] for pt in pts if pt["status"] == "ok"]
        s = {
            "decode_tok_s": summarize(m["decode_tok_s"] for m in ok),
            "stall_ms": summarize(m.get("stall_ms") for m in ok),
            "prefill_ttft_ms": summarize(m.get("prefill_ttft_ms") for m in ok),
            "runs_ok": len(ok),
            "retries": sum(pt["retries"] for pt in pts),
            "status": "ok" if len(ok) == args.runs else pts[-1]["status"],
        }
        summary[phase] = s
        rows.append(
            [
                phase,
                s["decode_tok_s"]["median"],
                s["stall_ms"]["median"],
                s["prefill_ttft_ms"]["median"],
                s["retries"],
                s["status"],
            ]
        )
    solo_v = summary["solo"]["decode_tok_s"]["median"]
    under_v = summary["under_prefill"]["decode_tok_s"]["median"]
    ratio = under_v / solo_v if solo_v and under_v is not None else None
    summary["under_over_solo"] = ratio
    print(
        cli.table(
            rows, ["phase", "decode_tok_s", "stall_ms", "prefill_ttft_ms", "retries", "status"]
        )
    )
    print(f"decode under prefill / solo: {cli.fmt(ratio, 3)} (prefill {n_prefill} tokens)")
    if args.plot:
        cli.plot(
            args.plot,
            list(res),
            [("decode tok/s", {"median": [solo_v, under_v]})],
            "phase",
            f"bench_interfere {b.model} (prefill {n_prefill} tok)",
        )
    return cli.finish(b, summary)


if __name__ == "__main__":
    sys.exit(main())
