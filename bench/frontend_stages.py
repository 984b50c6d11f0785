"""The front end of a turn, stage by stage, in real vLLM servers, from 2k to 500k tokens of history.

Boots one real CPU-engine server per arm (`make engine`; the tiny model's `window` spec: a
512-token sliding window, so the prefill of a turn's new tokens does not grow with the
history, as DeepSeek-V4's sparse attention reads a fixed 512 selected tokens) with the
overlay plugin's measurement-only stage timing on (DSV4_STAGE_TIMING_DIR, and vLLM's
`--middleware` option for the request's arrival). Arm `off` runs with every front-end cache
off, arm `on` with all of them on: the tokenizer cache (VLLM_INCREMENTAL_ENCODE_CACHE=1), the
block-hash cache (VLLM_INCREMENTAL_BLOCK_HASHES=1), the tail-primed detokenizer
(VLLM_INCREMENTAL_DETOKENIZER=1) and the incremental prompt hand-off to the engine core
(VLLM_INCREMENTAL_PROMPT_HANDOFF=1).

One conversation, the same on every arm: its history grows to each `--depths` value by
documents of `--fill-message-tokens` tokens (each answered "Noted."), sent as one request
per depth (not measured: it prefills the new history), then `--turns` measured turns of
`--turn-tokens` tokens each. Each request goes to every arm back to back, the order
alternating, one request in flight at a time. Each measured turn's TTFT (the client's, from
the request's departure to the first SSE chunk, kernel-stamped) is split into the stages of
bench/benchlib/stages.py, which add up to it exactly; an event of a request that is not ours
in a turn's window makes the turn contaminated (retried with a tagged message).

A depth whose history prefill would not fit in what is left of `--budget-s` (estimated from
the throughput of the fills so far) is skipped, and the JSON says so.

Example: python -m bench.frontend_stages --depths 2k,10k,50k,100k,200k,500k --turns 5 \\
    --json bench/results/frontend/frontend_stages.json \\
    --plot bench/results/frontend/frontend_stages.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchlib import EXIT_ERROR, EXIT_INTERRUPTED, stagereport, stages
from bench.benchlib.cli import log
from bench.benchlib.runner import git_sha
from bench.benchlib.stageturns import SERVED, Arm, Conversation, Reply, chars_per_token, send
from bench.chat_ttft_ab import command, machine, write_json
from bench.headline_real import path_prefixes
from bench.realserver import (
    Server,
    ServerError,
    build_model,
    default_engine_venv,
    engine_env,
    serve_argv,
    wait_all,
)
from pairctl.cli import argtypes
from pairctl.endpoint import Endpoint

MIDDLEWARE = "dsv4_flash_overlays.stage_timing.ArrivalMark"
# Each arm's overlay flags (the stage timing is on in both).
FRONT_END_FLAGS = (
    "VLLM_INCREMENTAL_ENCODE_CACHE",
    "VLLM_INCREMENTAL_BLOCK_HASHES",
    "VLLM_INCREMENTAL_DETOKENIZER",
    "VLLM_INCREMENTAL_PROMPT_HANDOFF",
)
ARMS: dict[str, dict[str, str]] = {
    "off": dict.fromkeys(FRONT_END_FLAGS, "0"),
    "on": dict.fromkeys(FRONT_END_FLAGS, "1"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.frontend_stages",
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 every measured turn clean on every arm; 1 a server did not boot, "
        "a request failed or a turn's events were incomplete; 3 a turn contaminated on every "
        "attempt; 130 interrupted.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--engine-venv",
        type=Path,
        default=default_engine_venv(),
        help="the CPU engine venv (make engine)",
    )
    p.add_argument("--model-spec", default="window", help="sim.engine.tiny_model --spec")
    p.add_argument("--arms", default="off,on", help=f"arms to run, of {', '.join(ARMS)}")
    p.add_argument(
        "--ports", type=argtypes.int_list, default="18311,18312", help="one loopback port per arm"
    )
    p.add_argument(
        "--depths",
        type=argtypes.size_list,
        default="2k,10k,50k,100k,200k,500k",
        help="tokens of history at which turns are measured, increasing",
    )
    p.add_argument("--turns", type=argtypes.int_at_least(1), default=5, help="per depth")
    p.add_argument(
        "--turn-tokens", type=argtypes.size, default="300", help="size of each measured turn"
    )
    p.add_argument(
        "--fill-message-tokens",
        type=argtypes.size,
        default="4k",
        help="size of each document that grows the history",
    )
    p.add_argument(
        "--max-tokens", type=argtypes.int_at_least(1), default=2, help="reply length per turn"
    )
    p.add_argument(
        "--retries",
        type=argtypes.non_negative_int,
        default=2,
        help="attempts more for a turn another request shared",
    )
    p.add_argument(
        "--budget-s",
        type=argtypes.float_above(0.0),
        default=1800.0,
        help="skip a depth whose history prefill would not fit in what is left of this",
    )
    p.add_argument("--timeout-s", type=argtypes.float_above(0.0), default=900.0, help="per request")
    p.add_argument(
        "--boot-timeout-s", type=argtypes.float_above(0.0), default=600.0, help="wait for boot"
    )
    p.add_argument("--seed", type=int, default=0, help="of the conversation's text")
    p.add_argument("--log-dir", type=Path, default=None, help="server logs and stage files")
    p.add_argument(
        "--json", dest="json_path", type=argtypes.output_file, default=None, help="result JSON"
    )
    p.add_argument(
        "--plot", type=argtypes.png_file, default=None, help="stacked-bar plot (.png/.svg/.pdf)"
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="no run: print the table and draw --plot from a recorded run's JSON",
    )
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if (
        not args.arms
        or any(a not in ARMS for a in args.arms)
        or len(set(args.arms)) < len(args.arms)
    ):
        p.error(f"--arms takes distinct names of {', '.join(ARMS)}")
    if len(args.ports) < len(args.arms) or len(set(args.ports)) < len(args.ports):
        p.error("--ports needs one distinct port per arm")
    if sorted(args.depths) != args.depths:
        p.error("--depths must be increasing")
    if not (args.engine_venv / "bin/vllm").exists():
        p.error(f"--engine-venv {args.engine_venv} has no bin/vllm; run make engine")
    return args


def run(args: argparse.Namespace, arms: list[Arm]) -> dict[str, Any]:
    conv = Conversation(args.seed, chars_per_token(arms[0].endpoint))
    doc: dict[str, Any] = {"depths": [], "skipped_depths": [], "fills": []}
    t_start = time.monotonic()
    tok_s: list[float] = []
    prompt_tokens = 0
    k = 0
    for arm in arms:  # warm-up, unmeasured
        send(arm, [{"role": "user", "content": "Hello."}], f"warm-{arm.name}", args)
    for depth in args.depths:
        need = depth - prompt_tokens - args.turn_tokens
        left = args.budget_s - (time.monotonic() - t_start)
        if need > 0 and tok_s:
            est = len(arms) * need / min(tok_s) + args.turns * len(arms) * 2 * depth / 1e5
            if est > left:
                why = f"estimated {est:.0f} s (fill at {min(tok_s):.0f} tok/s) > {left:.0f} s left"
                doc["skipped_depths"].append({"depth": depth, "why": why})
                log(f"depth {depth}: skipped ({why})")
                continue
        if need > 0:
            msgs = conv.fill(need, args.fill_message_tokens)
            for arm in order(arms, k):
                t0 = time.monotonic()
                r = send(arm, msgs, f"fill{depth}-{arm.name}-{k}", args)
                if not r.ok:
                    raise ServerError(f"fill to {depth} failed on {arm.name}: {r.error}")
                dt_s = time.monotonic() - t0
                tok_s.append(need / dt_s)
                doc["fills"].append(
                    {
                        "depth": depth,
                        "arm": arm.name,
                        "s": round(dt_s, 2),
                        "prompt_tokens": r.prompt_tokens,
                    }
                )
                log(f"fill to {depth} on {arm.name}: {r.prompt_tokens} tokens in {dt_s:.1f} s")
                prompt_tokens = r.prompt_tokens or prompt_tokens
            k += 1
            conv.commit(msgs)
        rows = []
        for t in range(args.turns):
            msgs = conv.turn(args.turn_tokens)
            got = {}
            for arm in order(arms, k):
                got[arm.name] = measured(arm, msgs, f"d{depth}-t{t}-{arm.name}", args)
            k += 1
            conv.commit(msgs)
            prompt_tokens = max((r.prompt_tokens or 0) for r in got.values())
            rows.append(got)
            log(
                f"depth {depth} turn {t}: {prompt_tokens} prompt tokens, "
                + ", ".join(f"{a} {stagereport.fmt_ms(r.ttft_ms)} ms" for a, r in got.items())
            )
        doc["depths"].append({"depth": depth, "turns": rows})
    return doc


def order(arms: list[Arm], k: int) -> list[Arm]:
    return arms if k % 2 == 0 else arms[::-1]


def measured(arm: Arm, msgs: list[dict[str, str]], tag: str, args: argparse.Namespace) -> Reply:
    """A measured turn; retried with a tagged message while foreign requests share it."""
    r = send(arm, msgs, tag, args)
    attempt = 0
    while r.ok and r.foreign and attempt < args.retries:
        attempt += 1
        log(f"{tag}: foreign requests {r.foreign[:3]} in the window; attempt {attempt + 1}")
        msgs = [
            *msgs[:-1],
            {"role": "user", "content": f"(attempt {attempt}) " + msgs[-1]["content"]},
        ]
        r = send(arm, msgs, f"{tag}-a{attempt}", args)
    r.retries = attempt
    return r


def boot(args: argparse.Namespace, log_dir: Path, servers: list[Server]) -> list[Arm]:
    model = build_model(args.engine_venv, args.model_spec)
    log(f"model: {model}")
    max_len = min(1_048_576, int(max(args.depths) * 1.1) + 8192)
    arms = []
    for name, port in zip(args.arms, args.ports, strict=False):
        stage_dir = log_dir / f"stages_{name}"
        stage_dir.mkdir(parents=True, exist_ok=True)
        argv = serve_argv(args.engine_venv, model, port, SERVED)
        argv += ["--middleware", MIDDLEWARE, "--max-model-len", str(max_len)]
        env = engine_env(ARMS[name]["VLLM_INCREMENTAL_ENCODE_CACHE"] == "1", ARMS[name])
        env["DSV4_STAGE_TIMING_DIR"] = str(stage_dir)
        s = Server(name, port, log_dir / f"vllm_{name}.log", argv, env)
        servers.append(s)
        arms.append(Arm(name, s, stage_dir, Endpoint.for_host("127.0.0.1", port)))
    for s in servers:
        log(f"booting the {s.name} server on {s.url} (log {s.log_path})")
        s.start()
    wait_all(servers, args.boot_timeout_s, log)
    for a in arms:
        skipped = stages.skipped_targets(a.stage_dir)
        if skipped:
            log(f"{a.name}: stages not timed: {skipped}")
    return arms


def replot(args: argparse.Namespace) -> int:
    """The table and the plot of a recorded run, from its JSON (its raw turns)."""
    doc = json.loads(args.from_json.read_text())
    summary = stagereport.summarize(doc["raw"], doc["summary"]["arms"])
    stagereport.print_report(summary)
    if args.plot:
        stagereport.plot(args.plot, summary)
    return stagereport.exit_code(summary)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return replot(args)
    signal.signal(signal.SIGTERM, _interrupt)
    servers: list[Server] = []
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    load_before = list(os.getloadavg())
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="frontend_stages."))
    try:
        arms = boot(args, log_dir, servers)
        raw = run(args, arms)
        summary = stagereport.summarize(raw, [a.name for a in arms])
        stagereport.print_report(summary)
        doc = {
            "schema_version": 1,
            "script": "frontend_stages",
            "date_utc": started,
            "ended_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": command(),
            "git_sha": git_sha(),
            "machine": machine() | {"loadavg_before": load_before},
            "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "stages": [{"stage": s, "kind": k, "what": w} for s, k, w in stages.STAGES],
            "servers": {
                s.name: {
                    "argv": s.argv,
                    "env": {
                        k: v for k, v in s.env.items() if k.startswith(("VLLM_", "TORCH_", "DSV4_"))
                    },
                    "boot_s": s.ready_s,
                    "overlay_lines": [
                        ln for ln in s.log_text().splitlines() if "dsv4-flash-overlays:" in ln
                    ][:12],
                    "stages_not_timed": stages.skipped_targets(a.stage_dir),
                }
                for s, a in zip(servers, arms, strict=True)
            },
            "summary": summary,
            "raw": stagereport.raw_json(raw),
            "_path_prefixes": path_prefixes(args.engine_venv),
        }
        write_json(args.json_path, doc)
        if args.plot:
            stagereport.plot(args.plot, summary)
        return stagereport.exit_code(summary)
    except KeyboardInterrupt:
        print("frontend_stages: interrupted; stopping the servers", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerError as e:
        log(f"frontend_stages: {e}")
        return EXIT_ERROR
    finally:
        for s in servers:
            try:
                s.stop()
            except KeyboardInterrupt:
                s.stop(grace_s=0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
