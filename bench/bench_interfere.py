#!/usr/bin/env python3
"""Decode under prefill: a stream's decode tok/s alone, then while another request prefills.

Phase "solo": one decoding stream alone (guarded: the server must show only it).
Phase "under prefill": the same stream; after --lead-ms, a second request with a long prompt
(--prefill-tokens, max_tokens 1) is sent. Steps that carry a prefill chunk are longer: the run of
the decoding stream's gaps that exceed 1.5x its own earlier gap and ends at the long request's
first token is the interfered steps; decode_tok_s = tokens per event / their median (step_ms).
stall_ms is the longest gap of the decoding stream while the long request was pending.

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

from bench.benchlib import cli, prompts
from bench.benchlib.guard import InFlightTracker
from bench.benchlib.stats import NS_PER_S, chunk_token_counts, median, request_metrics, summarize
from bench.benchlib.stream import StreamResult

STRETCH = 1.5  # a step this much longer than the stream's solo gap is an interfered step


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
