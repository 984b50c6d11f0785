"""Through vLLM's router vs straight to the pair: multi-turn TTFT with and without affinity, and
the router's own overhead.

Part 1, multi-turn: --conversations concurrent chats of --turns turns (each turn re-sends the
whole history, as chat clients do). Three variants, fresh conversations each, interleaved
per repeat so they share the machine's state:
  direct       each conversation talks to one pair itself (the pair the router would pick)
  affinity     through a consistent_hash router with one X-Session-ID per conversation
  round_robin  through a round_robin router (a conversation's turns land on any pair)
Per turn: median TTFT and the prefix-cache hit rate, read from the pairs' own /metrics.

Part 2, overhead: short requests (8 tokens) to one pair, direct vs through the affinity
router, at each --overhead-concurrency; median TTFT and per-request latency, and the gap.

router_added_ms columns (simulated pairs only): the same gap measured outside the engine,
client time minus the pair's own record of the request (bench/bench_router_runs.py), which
the engine's batching cannot blur. Real vLLM keeps no such record: the columns stay empty.

Both routers run locally with the command line the fleet deploys (pairctl.fleet.router).
Goals (docs/fleet.md): affinity turn-N TTFT within 5% + 2 ms of direct; router overhead
< 2 ms median per request at c=64. The pairs must be idle (checked; exit 3 otherwise).

Example (two simulated pairs; README "Scaling out"):
  python -m bench.bench_router --pairs http://127.0.0.1:18101,http://127.0.0.1:18102
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from bench import bench_router_runs as runs
from bench.benchlib import (
    EXIT_CONTAMINATED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    MAX_CONCURRENCY,
    report,
)
from bench.benchlib.cli import entry, log
from bench.benchlib.runner import git_sha
from bench.benchlib.stats import summarize
from pairctl.cli import argtypes as t
from pairctl.cli import options
from pairctl.contracts import BENCH_ROUTER_EXITS, exit_line
from pairctl.endpoint import Endpoint, redacted_argv

VARIANTS = ("direct", "affinity", "round_robin")


def _pair_endpoints(text: str) -> list[Endpoint]:
    """'URL,URL[,...]' -> Endpoints (the benches' own URL rules); two or more."""
    try:
        eps = [Endpoint.parse(u) for u in text.split(",") if u.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if len(eps) < 2:
        raise argparse.ArgumentTypeError("needs at least two endpoints, comma-separated")
    seen: set[str] = set()
    for e in eps:
        if e.base in seen:  # one pair twice: "affinity" would compare a pair with itself
            raise argparse.ArgumentTypeError(
                f"{e.base} is given twice; each endpoint must be a different pair"
            )
        seen.add(e.base)
    return eps


EPILOG = exit_line(BENCH_ROUTER_EXITS)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument(
        "--pairs",
        required=True,
        type=_pair_endpoints,
        help="comma-separated pair endpoints (2 or more; HOST:PORT and /v1 accepted)",
    )
    p.add_argument("--router-bin", default=runs.default_router_bin(), help="vllm-router binary")
    p.add_argument(
        "--router-cpus",
        default=None,
        help="run the routers on these CPUs (taskset -c LIST), as a router host has its own",
    )
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument(
        "--conversations", type=t.int_at_least(2), default=16, help="concurrent conversations"
    )
    p.add_argument("--turns", type=t.int_at_least(2), default=6, help="turns per conversation")
    p.add_argument(
        "--first-tokens", type=t.size, default="2k", help="size of the first user message"
    )
    p.add_argument(
        "--turn-tokens", type=t.size, default="1k", help="size of each later user message"
    )
    p.add_argument("--max-tokens", type=t.int_at_least(1), default=32, help="reply length per turn")
    p.add_argument(
        "--repeats", type=t.int_at_least(1), default=2, help="repeats of the variant set"
    )
    p.add_argument(
        "--overhead-concurrency",
        dest="levels",
        type=t.int_list_at_most(MAX_CONCURRENCY),
        default="1,64",
        help=f"concurrency levels of part 2 (each 1..{MAX_CONCURRENCY})",
    )
    p.add_argument(
        "--overhead-requests", type=t.int_at_least(1), default=128, help="requests per level/side"
    )
    p.add_argument(
        "--overhead-warmups",
        type=t.int_at_least(0),
        default=1,
        help="unmeasured waves per level/side first",
    )
    p.add_argument("--skip-multiturn", action="store_true", help="only part 2")
    p.add_argument("--skip-overhead", action="store_true", help="only part 1")
    p.add_argument("--timeout-s", type=t.seconds(0), default=600, help="per-request socket timeout")
    p.add_argument(
        "--json",
        dest="json_path",
        type=t.output_file,
        default=None,
        help="write results JSON here (its directory must exist)",
    )


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    args, p = options.namespace(
        argv,
        add_cli_args,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=EPILOG,
    )
    args.pair_urls = args.pairs  # Endpoints; the result JSON records their base URLs
    return args


def idle_or_exit(sess: requests.Session, pairs: list[Endpoint]) -> None:
    for ep, snap in zip(pairs, runs.scrape_all(sess, pairs), strict=True):
        if snap.in_flight:
            log(f"{ep} has {snap.in_flight:g} request(s) running or waiting: not idle")
            raise SystemExit(EXIT_CONTAMINATED)


def models(sess: requests.Session, ep: Endpoint) -> tuple[str, bool]:
    data = sess.get(ep.url("/v1/models"), timeout=10).json()["data"]
    return data[0]["id"], any(m.get("owned_by") == "spark-twin-simulator" for m in data)


def part1(args: argparse.Namespace, model: str, aff: runs.LocalRouter, rr: runs.LocalRouter):
    """Multi-turn TTFT per variant: {variant: {turn: TurnStats}}."""
    sess = requests.Session()
    sids = [f"bench-conv-{i}" for i in range(args.conversations)]
    home = [runs.which_pair(sess, args.pair_urls, aff.endpoint, model, s) for s in sids]
    per_pair = [home.count(i) for i in range(len(args.pair_urls))]
    log(f"sessions per pair (consistent_hash): {per_pair}")
    targets = {
        "direct": [args.pair_urls[h] for h in home],
        "affinity": [aff.endpoint.with_session(s) for s in sids],
        "round_robin": [rr.endpoint.with_session(s) for s in sids],
    }
    stats: dict[str, dict[int, runs.TurnStats]] = {v: {} for v in VARIANTS}
    for rep in range(args.repeats):
        order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
        for v in order:
            idle_or_exit(sess, args.pair_urls)
            log(f"repeat {rep}: {v} ({args.conversations} conversations x {args.turns} turns)")
            runs.conversations(v, targets[v], model, args.pair_urls, args, rep, stats[v])
    return stats, home


def part2(args: argparse.Namespace, model: str, aff: runs.LocalRouter, home: int | None):
    """Overhead per concurrency level: {c: {"direct"|"router": OverheadStats}}."""
    sess = requests.Session()
    sid, pair = "bench-overhead-0", 0
    for i in range(64):
        s = f"bench-overhead-{i}"
        pair = runs.which_pair(sess, args.pair_urls, aff.endpoint, model, s)
        sid = s
        if home is None or pair == home:
            break
    out: dict[int, dict[str, runs.OverheadStats]] = {}
    for c in args.levels:
        waves = max(1, args.overhead_requests // c)
        side = {"direct": runs.OverheadStats(), "router": runs.OverheadStats()}
        targets = {
            "direct": args.pair_urls[pair],
            "router": aff.endpoint.with_session(sid),
        }
        for target in targets.values():  # unmeasured: warm connection pools, as in use
            runs.overhead(target, model, c, args.overhead_warmups, args, runs.OverheadStats())
        for w in range(waves):
            idle_or_exit(sess, args.pair_urls)
            order = ("direct", "router") if w % 2 == 0 else ("router", "direct")
            for name in order:
                runs.overhead(targets[name], model, c, 1, args, side[name])
        recs = runs.server_records(sess, args.pair_urls)
        for s in side.values():
            s.settle(recs)
        log(f"overhead c={c}: {waves} waves per side")
        out[c] = side
    return out, args.pair_urls[pair]


def goal_affinity(direct: float | None, aff: float | None) -> bool | None:
    if direct is None or aff is None:
        return None
    return aff <= direct * 1.05 + 2.0


def table1(stats: dict[str, dict[int, runs.TurnStats]]) -> tuple[str, list[dict[str, Any]]]:
    rows, js = [], []
    for k in sorted(stats["direct"]):
        med = {v: summarize(stats[v][k].ttft_ms)["median"] for v in VARIANTS}
        hit = {v: stats[v][k].hit_rate for v in VARIANTS}
        ptok = summarize(stats["direct"][k].prompt_tokens)["median"]
        d = med["direct"]
        rel = {v: (100 * (med[v] / d - 1) if d and med[v] is not None else None) for v in VARIANTS}
        ok = goal_affinity(d, med["affinity"]) if k > 0 else None
        added = _gap(
            summarize(stats["affinity"][k].outside_ttft_ms)["median"],
            summarize(stats["direct"][k].outside_ttft_ms)["median"],
        )
        rows.append(
            [
                k,
                ptok,
                med["direct"],
                med["affinity"],
                rel["affinity"],
                med["round_robin"],
                rel["round_robin"],
                *(None if hit[v] is None else 100 * hit[v] for v in VARIANTS),
                {True: "yes", False: "NO", None: "-"}[ok],
                added,
            ]
        )
        js.append(
            {
                "turn": k,
                "prompt_tokens_median": ptok,
                "ttft_ms": {v: summarize(stats[v][k].ttft_ms) for v in VARIANTS},
                "prefix_hit_rate": hit,
                "affinity_within_goal": ok,
                "outside_engine_ttft_ms": {
                    v: summarize(stats[v][k].outside_ttft_ms) for v in VARIANTS
                },
                "router_added_ttft_ms_median": added,
                "errors": {v: stats[v][k].errors for v in VARIANTS},
            }
        )
    heads = [
        "turn",
        "prompt_tok",
        "direct_ms",
        "affinity_ms",
        "aff_vs_direct_%",
        "round_robin_ms",
        "rr_vs_direct_%",
        "hit%_direct",
        "hit%_aff",
        "hit%_rr",
        "goal",
        "router_added_ms",
    ]
    return report.table(rows, heads), js


def table2(ov: dict[int, dict[str, runs.OverheadStats]]) -> tuple[str, list[dict[str, Any]]]:
    rows, js = [], []
    for c, side in ov.items():
        s = {n: (summarize(side[n].ttft_ms), summarize(side[n].e2e_ms)) for n in side}
        dt_ttft = _gap(s["router"][0]["median"], s["direct"][0]["median"])
        dt_e2e = _gap(s["router"][1]["median"], s["direct"][1]["median"])
        o = {
            n: (summarize(side[n].outside_ttft_ms), summarize(side[n].outside_e2e_ms)) for n in side
        }
        added_ttft = _gap(o["router"][0]["median"], o["direct"][0]["median"])
        added_e2e = _gap(o["router"][1]["median"], o["direct"][1]["median"])
        rows.append(
            [
                c,
                s["direct"][0]["median"],
                s["router"][0]["median"],
                dt_ttft,
                s["direct"][1]["median"],
                s["router"][1]["median"],
                dt_e2e,
                added_ttft,
                added_e2e,
                s["router"][1]["n"],
                len(side["direct"].errors) + len(side["router"].errors),
            ]
        )
        js.append(
            {
                "concurrency": c,
                "direct": {"ttft_ms": s["direct"][0], "e2e_ms": s["direct"][1]},
                "router": {"ttft_ms": s["router"][0], "e2e_ms": s["router"][1]},
                "overhead_ttft_ms_median": dt_ttft,
                "overhead_e2e_ms_median": dt_e2e,
                "outside_engine": {n: {"ttft_ms": o[n][0], "e2e_ms": o[n][1]} for n in o},
                "router_added_ttft_ms_median": added_ttft,
                "router_added_e2e_ms_median": added_e2e,
                "errors": {n: side[n].errors for n in side},
            }
        )
    heads = [
        "conc",
        "direct_ttft_ms",
        "router_ttft_ms",
        "d_ttft_ms",
        "direct_e2e_ms",
        "router_e2e_ms",
        "d_e2e_ms",
        "router_added_ttft_ms",
        "router_added_e2e_ms",
        "n",
        "errors",
    ]
    return report.table(rows, heads), js


def _gap(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args = parse_args(argv)
    sess = requests.Session()
    try:
        model, sim = models(sess, args.pair_urls[0])
        model = args.model or model
        idle_or_exit(sess, args.pair_urls)
    except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
        log(f"pair endpoint not ready: {exc}")
        return EXIT_ERROR
    except SystemExit as exc:  # idle_or_exit: a pair is busy, nothing was measured
        return int(exc.code or EXIT_ERROR)
    label = " [SIMULATOR: spark twin, not hardware]" if sim else ""
    logdir = Path(tempfile.mkdtemp(prefix="bench-router-"))
    cpus = args.router_cpus
    aff = runs.LocalRouter(
        args.router_bin, "consistent_hash", args.pair_urls, logdir / "ch.log", cpus
    )
    rr = runs.LocalRouter(args.router_bin, "round_robin", args.pair_urls, logdir / "rr.log", cpus)
    doc: dict[str, Any] = {
        "script": "bench_router",
        "command_line": redacted_argv([sys.executable, *sys.argv]),
        "git_sha": git_sha(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "loadavg_at_start": os.getloadavg(),
            "python": sys.version,
        },
        "simulator": sim,
        "params": {k: v for k, v in vars(args).items()},
        "router_logs": str(logdir),
    }
    code = EXIT_OK
    try:
        aff.wait_ready()
        rr.wait_ready()
        home = None
        if not args.skip_multiturn:
            stats, homes = part1(args, model, aff, rr)
            text, doc["multi_turn"] = table1(stats)
            print(f"\nmulti-turn TTFT per turn, median over repeats x conversations{label}")
            print(text)
            home = max(set(homes), key=homes.count)
            if any(turn["errors"][v] for turn in doc["multi_turn"] for v in VARIANTS):
                code = EXIT_ERROR
        if not args.skip_overhead:
            ov, pair_url = part2(args, model, aff, home)
            text, doc["overhead"] = table2(ov)
            print(f"\nrouter overhead, short requests to {pair_url}{label}")
            print(text)
            if any(e for row in doc["overhead"] for e in row["errors"].values()):
                code = EXIT_ERROR
    except SystemExit as exc:
        code = int(exc.code or EXIT_ERROR)
    except RuntimeError as exc:
        log(str(exc))
        code = EXIT_ERROR
    except KeyboardInterrupt:  # the parts finished so far are in the JSON below
        done = [k for k in ("multi_turn", "overhead") if k in doc]
        where = f"; parts done ({', '.join(done) or 'none'}) in {args.json_path}"
        log("interrupted" + (where if args.json_path else ""))
        code = EXIT_INTERRUPTED
    finally:
        aff.stop()
        rr.stop()
    doc["ended_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    doc["exit_code"] = code
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return code


if __name__ == "__main__":
    entry(main)
