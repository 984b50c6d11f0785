"""The spin-budget overlay on a real CPU pair: CPU per generated token, idle CPU, decode tok/s.

Boots a real two-node TP=2 pair on loopback (bench/realpair.py: the CPU engine of `make
engine`, the tiny model, ngram drafts, our plugin on PYTHONPATH) once per round, the two
variants interleaved (A/B/A/B...): `vllm` (VLLM_DSV4_SPIN_BUDGET_MS unset: vLLM's 1 s) and
`budget` (the flag set to --budget-ms). Each round checks the overlay's log lines (every
process of the `budget` pair logs "spin-budget active", the `vllm` pair logs no spin-budget
line at all), then measures

  idle:   CPU seconds of each node's process tree over --idle-s with no request, after
          --settle-s of quiet (as % of one core);
  decode: --requests sequential streamed completions of --max-tokens tokens each
          (ignore_eos, temperature 0): decode tok/s per request, and each node's CPU
          seconds over the phase per generated token.

`uptime`'s load average is recorded beside every phase: the box may be shared. The table
prints the median over rounds (idle, CPU/token) and over all requests (tok/s) per variant;
the JSON (--json FILE) holds every round, each process's CPU and the load.

Example: python -m bench.spin_budget_pair --rounds 2 \\
    --json bench/results/spin_budget/spin_budget_pair.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import chat_ttft_ab, headline_real
from bench.benchlib import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, proccpu, report, stats, stream
from bench.benchlib.cli import log
from bench.benchlib.runner import git_sha
from bench.realpair import SERVED, RealPair, make_pair
from bench.realserver import ServerError, build_model, default_engine_venv
from pairctl.cli import argtypes
from pairctl.endpoint import Endpoint
from pairctl.engine.stack import HOOKS_ENV, load_stack

FLAG = "VLLM_DSV4_SPIN_BUDGET_MS"
ACTIVE = "dsv4-flash-overlays: spin-budget active"
ANY_LINE = "dsv4-flash-overlays: spin-budget"
# Inherited variables that would change either variant behind its back.
DROP = (FLAG, "DSV4_OVERLAYS_DISABLE", HOOKS_ENV)
PROMPT = (
    "The two machines share one cable and one job: every step of the model runs on both, "
    "and each waits for the other before the next token. Write down what happens next."
)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine-venv", type=Path, default=default_engine_venv(), help="the CPU engine venv"
    )
    p.add_argument("--model-dir", type=Path, default=None, help="serve this model dir instead")
    p.add_argument(
        "--budget-ms",
        type=argtypes.float_above(0.0, inclusive=True),
        default=2.0,
        help=f"{FLAG} of the budget variant (the peers' 2 ms)",
    )
    p.add_argument("--rounds", type=argtypes.int_at_least(1), default=2, help="A/B pairs of boots")
    p.add_argument("--requests", type=argtypes.int_at_least(1), default=8, help="per round")
    p.add_argument("--max-tokens", type=argtypes.int_at_least(2), default=256, help="per request")
    p.add_argument("--warmups", type=argtypes.int_at_least(0), default=2, help="per round")
    p.add_argument("--idle-s", type=argtypes.seconds(0), default=20.0, help="idle window")
    p.add_argument(
        "--settle-s",
        type=argtypes.seconds(0, inclusive=True),
        default=5.0,
        help="quiet before the idle window (vLLM's own readers park 1 s after a message)",
    )
    p.add_argument("--boot-timeout-s", type=argtypes.seconds(0), default=600.0, help="per boot")
    p.add_argument("--log-dir", type=Path, default=None, help="node logs (default: a temp dir)")
    p.add_argument("--json", dest="json_path", type=argtypes.output_file, default=None)


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    if isinstance(argv, argparse.Namespace):
        return argv
    p = argparse.ArgumentParser(
        prog="python -m bench.spin_budget_pair",
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 ok; 1 a pair did not boot, a request failed or the overlay "
        "check failed; 130 on Ctrl-C.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_cli_args(p)
    a = p.parse_args(argv)
    if not (a.engine_venv / "bin/vllm").exists():
        p.error(f"--engine-venv {a.engine_venv} has no bin/vllm; run make engine")
    return a


def load() -> dict[str, Any]:
    """The box's load right now: `uptime` as printed, and the three load averages."""
    try:
        up = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        up = None
    return {"uptime": up, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def sample(pair: RealPair) -> list[dict[int, proccpu.ProcCpu]]:
    return [proccpu.tree(root) for root in pair.roots()]


def node_cpu(before: list, after: list) -> list[dict[str, Any]]:
    out = []
    for b, a in zip(before, after, strict=True):
        d = proccpu.delta(b, a)
        out.append({"cpu_s": proccpu.total_s(d), "by_process": proccpu.by_name(d)})
    return out


def overlay_lines(pair: RealPair) -> list[list[str]]:
    """Each node's spin-budget lines (the plugin's one line per process)."""
    return [[ln for ln in n.log_text().splitlines() if ANY_LINE in ln] for n in pair.nodes]


def check_overlay(variant: str, lines: list[list[str]]) -> str:
    """Why the variant's logs are wrong for an A/B, or '' when they are right."""
    if variant == "vllm":
        return "" if not any(lines) else f"the vllm pair logged {lines}"
    for rank, node in enumerate(lines):
        if not node or any(ACTIVE not in ln for ln in node):
            return f"node {rank}: expected only '{ACTIVE}' lines, got {node}"
    return ""


def one_request(ep: Endpoint, max_tokens: int) -> dict[str, Any]:
    payload = {
        "model": SERVED,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    res = stream.stream_request(ep, "/v1/completions", payload, timeout_s=600)
    m = stats.request_metrics(res)
    keep = ("ok", "error", "ttft_ms", "decode_tok_s", "itl_max_ms", "completion_tokens")
    digest = hashlib.sha256(res.content.encode()).hexdigest()[:16]
    return {k: m[k] for k in keep} | {"text_sha256_16": digest}


def measure_round(pair: RealPair, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    ep = Endpoint.parse(pair.url)
    rnd: dict[str, Any] = {"variant": variant, "logs": [str(p) for p in pair.logs()]}
    for _ in range(args.warmups):
        if not one_request(ep, 16)["ok"]:
            raise ServerError(f"{variant}: a warm-up request failed; logs {pair.logs()}")
    time.sleep(args.settle_s)
    rnd["idle_load"] = load()
    before, t0 = sample(pair), time.monotonic()
    time.sleep(args.idle_s)
    after, wall = sample(pair), time.monotonic() - t0
    nodes = node_cpu(before, after)
    rnd["idle"] = {
        "wall_s": round(wall, 2),
        "nodes": nodes,
        "pct_of_one_core": [round(100 * n["cpu_s"] / wall, 2) for n in nodes],
        "pair_pct_of_one_core": round(100 * sum(n["cpu_s"] for n in nodes) / wall, 2),
    }
    rnd["decode_load"] = load()
    before, t0 = sample(pair), time.monotonic()
    reqs = [one_request(ep, args.max_tokens) for _ in range(args.requests)]
    after, wall = sample(pair), time.monotonic() - t0
    bad = [r["error"] for r in reqs if not r["ok"]]
    if bad:
        raise ServerError(f"{variant}: {len(bad)} request(s) failed: {bad[0]}")
    tokens = sum(r["completion_tokens"] or 0 for r in reqs)
    nodes = node_cpu(before, after)
    rnd["decode"] = {
        "wall_s": round(wall, 2),
        "tokens": tokens,
        "requests": reqs,
        "nodes": nodes,
        "cpu_ms_per_token": [round(1000 * n["cpu_s"] / tokens, 3) for n in nodes],
        "decode_tok_s_median": stats.median(r["decode_tok_s"] for r in reqs),
    }
    rnd["end_load"] = load()
    return rnd


def summarize(rounds: list[dict[str, Any]], budget_ms: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in ("vllm", "budget"):
        rs = [r for r in rounds if r["variant"] == variant]
        med = statistics.median
        out[variant] = {
            "rounds": len(rs),
            "idle_pct_node": [med(r["idle"]["pct_of_one_core"][i] for r in rs) for i in (0, 1)],
            "idle_pct_pair": med(r["idle"]["pair_pct_of_one_core"] for r in rs),
            "cpu_ms_per_token_node": [
                med(r["decode"]["cpu_ms_per_token"][i] for r in rs) for i in (0, 1)
            ],
            "decode_tok_s_median": stats.median(
                q["decode_tok_s"] for r in rs for q in r["decode"]["requests"]
            ),
            "decode_tok_s_per_round": [r["decode"]["decode_tok_s_median"] for r in rs],
            # A lost ping shows here: a parked reader re-checks only every 5 s.
            "itl_max_ms": max(
                (q.get("itl_max_ms") or 0.0 for r in rs for q in r["decode"]["requests"]),
                default=None,
            ),
        }
    a, b = out["vllm"], out["budget"]
    out["budget_ms"] = budget_ms
    texts = {q["text_sha256_16"] for r in rounds for q in r["decode"]["requests"]}
    out["same_text"] = len(texts) == 1
    out["goals"] = {
        "idle_under_5pct_of_a_core": b["idle_pct_pair"] < 5.0,
        "decode_not_slower": (b["decode_tok_s_median"] or 0) >= (a["decode_tok_s_median"] or 0),
    }
    return out


def print_report(summary: dict[str, Any]) -> None:
    rows = []
    for v in ("vllm", "budget"):
        s = summary[v]
        label = "vllm 1 s" if v == "vllm" else f"budget {summary['budget_ms']:g} ms"
        rows.append(
            [
                label,
                s["rounds"],
                *s["idle_pct_node"],
                s["idle_pct_pair"],
                *s["cpu_ms_per_token_node"],
                s["decode_tok_s_median"],
                s["itl_max_ms"],
            ]
        )
    heads = [
        "variant",
        "rounds",
        "idle% n0",
        "idle% n1",
        "idle% pair",
        "cpu ms/tok n0",
        "cpu ms/tok n1",
        "decode tok/s",
        "max gap ms",
    ]
    print(report.table(rows, heads))
    g = {k: "met" if v else "NOT met" for k, v in summary["goals"].items()}
    print(
        f"goals: pair idle under 5% of one core: {g['idle_under_5pct_of_a_core']}; "
        f"decode not slower: {g['decode_not_slower']}; "
        f"same text in every request: {summary['same_text']}"
    )


def run(args: argparse.Namespace, pairs: list[RealPair]) -> dict[str, Any]:
    model = args.model_dir or build_model(args.engine_venv, "default")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="spin_budget_pair."))
    log_dir.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    rounds = []
    for i in range(args.rounds):
        for variant in ("vllm", "budget"):
            # The rehearsal's stack table, as the launcher hands it to the plugin.
            extra = {HOOKS_ENV: load_stack("cpu").hooks_json()}
            if variant == "budget":
                extra[FLAG] = f"{args.budget_ms:g}"
            pair = make_pair(
                args.engine_venv / "bin/vllm", model, log_dir, f"r{i}-{variant}", extra, DROP
            )
            pairs.append(pair)
            log(f"round {i + 1}/{args.rounds} {variant}: booting (logs {log_dir})")
            pair.start()
            boot_s = pair.wait_ready(args.boot_timeout_s, log)
            lines = overlay_lines(pair)
            why = check_overlay(variant, lines)
            if why:
                raise ServerError(f"overlay check failed: {why}")
            rnd = measure_round(pair, variant, args) | {"round": i, "boot_s": boot_s}
            rnd["overlay_lines"] = lines
            rounds.append(rnd)
            log(
                f"  idle {rnd['idle']['pct_of_one_core']} % of a core, "
                f"{rnd['decode']['cpu_ms_per_token']} CPU ms/token, "
                f"{report.fmt(rnd['decode']['decode_tok_s_median'])} tok/s"
            )
            pair.stop()
    summary = summarize(rounds, args.budget_ms)
    print_report(summary)
    return {
        "schema_version": 1,
        "script": "spin_budget_pair",
        "date_utc": started,
        "ended_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": chat_ttft_ab.command(),
        "git_sha": git_sha(),
        "machine": chat_ttft_ab.machine(),
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model_dir": str(model),
        "node_argv": [n.argv for n in pairs[0].nodes],
        "summary": summary,
        "rounds": rounds,
        "_path_prefixes": headline_real.path_prefixes(args.engine_venv),
    }


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    pairs: list[RealPair] = []
    try:
        doc = run(args, pairs)
    except KeyboardInterrupt:
        print("spin_budget_pair: interrupted; stopping the pairs", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerError as e:
        log(f"spin_budget_pair: {e}")
        return EXIT_ERROR
    finally:
        for p in pairs:
            p.stop()
    if args.json_path:
        chat_ttft_ab.write_json(args.json_path, doc)
        log(f"JSON written to {args.json_path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
