"""The diffcheck command line: record a server's answers, compare simulator and real."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pairctl.cli import argtypes
from pairctl.contracts import DIFFCHECK_EXITS, codes, exit_line
from sim.diffcheck import compare, logs, peerloss, probe
from sim.diffcheck.pair import Pair, PairConfig

_EXIT = codes(DIFFCHECK_EXITS)
EXIT_OK, EXIT_DIFF = _EXIT["EXIT_OK"], _EXIT["EXIT_DIFF"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]
EPILOG = exit_line(DIFFCHECK_EXITS)

DESCRIPTION = (
    "Send one request corpus (OpenAI SDK shapes, `vllm bench serve` openai "
    "and openai-chat payloads, bad requests) to the simulator and to a real vLLM server "
    "and compare what clients depend on: status codes, response keys and types, error "
    "bodies, SSE chunk shapes, /v1/models, /health, vllm: metric names and labels, and "
    "the classes of boot/shutdown/peer-loss log lines."
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim.diffcheck", description=DESCRIPTION, epilog=EPILOG
    )
    add_cli_args(p)
    return p


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """record, compare, peer-loss and their flags onto ``p``."""
    p.description = p.description or DESCRIPTION
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the corpus against one server; write a snapshot")
    rec.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    rec.add_argument("--api-key", default=None, help="bearer token, if the server wants one")
    rec.add_argument(
        "--log",
        type=Path,
        action="append",
        default=[],
        help="the server's log (split into boot and shutdown line classes); repeatable",
    )
    rec.add_argument(
        "--event-log",
        action="append",
        default=[],
        metavar="KIND=FILE",
        help="a log of one event (e.g. peer_loss_idle=rank0.log); repeatable",
    )
    rec.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="provenance kept in the snapshot (machine, date, command)",
    )
    rec.add_argument("--out", type=Path, required=True, help="snapshot JSON to write")
    add = sub.add_parser(
        "add-logs",
        help="attach log line classes to a snapshot (a shutdown log exists only after the "
        "server stopped, so record first, stop the server, then add its log)",
    )
    add.add_argument("snapshot", type=Path)
    add.add_argument("--log", type=Path, action="append", default=[])
    add.add_argument("--event-log", action="append", default=[], metavar="KIND=FILE")
    pl = sub.add_parser(
        "peer-loss",
        help="boot a real loopback TP=2 pair per scenario and record what it does when a "
        "node goes (rank 1 killed idle / mid-stream, rank 0 killed, SIGTERM to rank 1)",
    )
    pl.add_argument("--engine-venv", type=Path, default=Path(".venv-engine"))
    pl.add_argument("--model", type=Path, default=None, help="default: the tiny model")
    pl.add_argument("--port", type=argtypes.port, default=18110)
    pl.add_argument("--master-port", type=argtypes.port, default=29555)
    pl.add_argument("--plugin-path", default="", help="PYTHONPATH for the nodes (our plugin)")
    pl.add_argument("--scenario", action="append", choices=sorted(peerloss.SCENARIOS))
    pl.add_argument("--boot-timeout", type=argtypes.seconds(0), default=400.0)
    pl.add_argument("--logs", type=Path, default=Path("out/peer-loss"))
    pl.add_argument("--note", action="append", default=[], metavar="KEY=VALUE")
    pl.add_argument("--out", type=Path, required=True)
    cmp_ = sub.add_parser("compare", help="compare simulator and real (snapshots or URLs)")
    cmp_.add_argument("sim", help="simulator snapshot JSON or URL")
    cmp_.add_argument("real", help="real-engine snapshot JSON or URL")
    cmp_.add_argument("--sim-log", type=Path, action="append", default=[])
    cmp_.add_argument("--real-log", type=Path, action="append", default=[])
    cmp_.add_argument("--json", type=Path, default=None, help="write the findings here")
    cmp_.add_argument("--all", action="store_true", help="also print matching cases")
    cmp_.add_argument("--api-key", default=None)


def _progress(name: str) -> None:
    print(f"  {name}", file=sys.stderr, flush=True)


def _snapshot(where: str, api_key: str | None, log_paths: list[Path]) -> dict[str, Any]:
    if where.startswith(("http://", "https://")):
        print(f"running the corpus against {where}", file=sys.stderr)
        snap = probe.record(where, api_key, _progress)
    else:
        snap = json.loads(Path(where).read_text())
    if log_paths:
        snap.setdefault("logs", {}).update(logs.read(log_paths, []))
    return snap


def table(findings: list[compare.Finding], show_same: bool) -> str:
    rows = [f for f in findings if show_same or f.verdict != "same"]
    head = ("verdict", "area", "case", "what", "sim", "real")
    cells = [head] + [(f.verdict, f.area, f.case, f.what, f.sim, f.real) for f in rows]
    cells = [tuple(c if len(c) <= 60 else c[:57] + "..." for c in row) for row in cells]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    counts = compare.summary(findings)
    lines.append(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def _tiny_model(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "sim.engine.tiny_model"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _peer_loss(args: argparse.Namespace) -> int:
    vllm = args.engine_venv / "bin" / "vllm"
    if not vllm.exists():
        print(f"diffcheck: {vllm} is missing; run `make engine`", file=sys.stderr)
        return EXIT_USAGE
    args.logs.mkdir(parents=True, exist_ok=True)
    cfg = PairConfig(
        vllm.resolve(),
        args.model or _tiny_model(args.engine_venv),
        args.port,
        args.master_port,
        args.logs,
        args.plugin_path,
    )
    result: dict[str, Any] = {
        "provenance": dict(n.partition("=")[::2] for n in args.note),
        "command": " ".join(["python -m sim.diffcheck", *sys.argv[1:]]),
        "node_argv": {"rank0": cfg.argv(0), "rank1": cfg.argv(1)},
        "scenarios": {},
    }
    result["provenance"].setdefault("recorded", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    for name in args.scenario or list(peerloss.SCENARIOS):
        print(f"{name}: booting a pair (~1-3 min on 2 cores)", file=sys.stderr, flush=True)
        result["scenarios"][name] = peerloss.run(
            name,
            Pair(cfg, name, peerloss.SCENARIO_ENV.get(name)),
            str(cfg.model),
            args.boot_timeout,
        )
        text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
        # this machine's paths are nobody else's: the venv and checkout by their roles
        text = text.replace(str(args.engine_venv.resolve()), ".venv-engine")
        text = text.replace(str(Path.cwd()), ".")
        args.out.write_text(text)
        print(f"{name}: recorded -> {args.out}", file=sys.stderr, flush=True)
    return EXIT_OK


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    """``argv``: the command line, or the Namespace ``dspark sim diffcheck`` parsed."""
    args = argv if isinstance(argv, argparse.Namespace) else _parser().parse_args(argv)
    try:
        if args.cmd == "record":
            snap = probe.record(args.url, args.api_key, _progress)
            snap["logs"] = logs.read(args.log, args.event_log)
            snap["provenance"] = dict(n.partition("=")[::2] for n in args.note)
            snap["provenance"].setdefault("recorded", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
            print(f"snapshot of {args.url}: {len(snap['cases'])} cases -> {args.out}")
            return EXIT_OK
        if args.cmd == "peer-loss":
            return _peer_loss(args)
        if args.cmd == "add-logs":
            snap = json.loads(args.snapshot.read_text())
            snap.setdefault("logs", {}).update(logs.read(args.log, args.event_log))
            args.snapshot.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
            print(f"{args.snapshot}: log events {', '.join(sorted(snap['logs']))}")
            return EXIT_OK
        sim = _snapshot(args.sim, args.api_key, args.sim_log)
        real = _snapshot(args.real, args.api_key, args.real_log)
        findings = compare.compare(sim, real)
        print(table(findings, args.all))
        if args.json:
            args.json.write_text(json.dumps(compare.as_json(findings), indent=1) + "\n")
        return EXIT_DIFF if any(f.verdict == "DIFF" for f in findings) else EXIT_OK
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except probe.ServerRefused as exc:
        print(f"diffcheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, KeyError) as exc:
        print(
            f"diffcheck: {exc} (is the server up and the snapshot a diffcheck JSON?)",
            file=sys.stderr,
        )
        return EXIT_USAGE
