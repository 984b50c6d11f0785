"""The operator's commands behind ``launch/dspark_launch.sh``: status, logs, watch and
sync-overlays (each gets the validated config from ``pairctl.cli``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from pairctl import EXIT_OK, EXIT_PREFLIGHT
from pairctl import lifecycle as lc
from pairctl import preflight as pf
from pairctl.config import PairConfig
from pairctl.docker import pair_containers
from pairctl.nodes import nodes
from pairctl.overlays import sync
from pairctl.plan import container_name
from pairctl.preflight import runner
from pairctl.recipe import Recipe
from pairctl.status import pair as pst
from pairctl.status import view as status_view
from pairctl.status import watch

EXIT_RUNTIME = 1
# What sync-overlays must know before it writes to two machines: that this is SPARK1 and
# SPARK2 is another machine (the checks, and the exit code, with which up refuses).
IDENTITY_CHECKS = ("PF-SELF-IS-SPARK1", "PF-DISTINCT-NODES")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def print_check(check: pf.Check) -> None:
    sys.stdout.write(pf.render_check(check))
    sys.stdout.flush()


def progress(msg: str) -> None:
    log(f"preflight: {msg}...")


def lock_path(cfg: PairConfig) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    # SPARK1 in the name: two test pairs on one machine may share a PAIR_ID.
    return f"{base}/dsv4-launch-{cfg.PAIR_ID}-{cfg.SPARK1}.lock"


def status(args: argparse.Namespace, cfg: PairConfig, recipe: Recipe, extra: list[str]) -> int:
    """Exit 0 healthy, 7 degraded, 8 down (with --watch: the last reading's)."""
    want = lc.current_plan(cfg, recipe, extra)
    if args.watch:
        interval = args.interval if args.interval is not None else 2.0

        def reading(prev: pst.MetricsSample | None):
            return pst.collect(cfg, prev, interval, want)

        return status_view.watch(reading, interval, args.count, as_json=args.json)
    interval = args.interval if args.interval is not None else 1.0
    st = pst.pair_status(cfg, interval_s=interval, want_plan=want)
    text = status_view.render_json(st) + "\n" if args.json else status_view.render_text(st)
    sys.stdout.write(text)
    return st.exit_code


def sync_overlays(
    args: argparse.Namespace, cfg: PairConfig, recipe: Recipe, extra: list[str]
) -> int:
    """Refuse, as up does (exit 3), unless this is SPARK1 and SPARK2 is another machine."""
    specs = tuple(pf.BY_ID[i] for i in IDENTITY_CHECKS)
    checks, _ = runner.run(cfg, recipe, extra, {}, print_check, progress, specs, False)
    if pf.failed(checks):
        log("sync-overlays refused: run it on this pair's rank-0 node; nothing was copied")
        return EXIT_PREFLIGHT
    return sync(cfg, Path(args.src))


def logs(args: argparse.Namespace, cfg: PairConfig, recipe: Recipe, extra: list[str]) -> int:
    """One rank's container log. A node that cannot be asked, or no container, is a message
    and exit 1 (never ssh's bare 255)."""
    node = nodes(cfg)[args.rank]
    name = container_name(cfg.PAIR_ID, args.rank)
    via = " over ssh" if node.remote else ""
    found, res = pair_containers(node, cfg.PAIR_ID)
    if res.rc != 0:
        why = (res.err or res.out).strip()[-300:] or f"rc={res.rc}"
        log(f"logs: cannot ask docker on {node.label}{via}: {why}")
        return EXIT_RUNTIME
    if not any(c.name == name for c in found):
        log(
            f"logs: no container {name} on {node.label}: the pair is not up there "
            "(see launch/dspark_launch.sh status)"
        )
        return EXIT_RUNTIME
    argv = ["docker", "logs"]
    if args.tail is not None:
        argv += ["--tail", str(args.tail)]
    if args.follow:
        argv.append("-f")
    argv.append(name)
    sys.stdout.flush()
    rc = subprocess.run(node.wrap(argv), check=False).returncode
    if rc == 0:
        return EXIT_OK
    if rc == 255 and node.remote:
        log(f"logs: ssh to {node.label} failed while reading {name}'s log")
    else:
        log(f"logs: docker logs {name} on {node.label} exited {rc}")
    return EXIT_RUNTIME


def watchdog(args: argparse.Namespace, cfg: PairConfig, recipe: Recipe, extra: list[str]) -> int:
    """Run the watchdog until SIGTERM/SIGINT (exit 0)."""
    wc = watch.WatchConfig(
        interval_s=args.interval,
        failures=args.failures,
        probe_timeout_s=args.probe_timeout,
        backoff_s=args.backoff,
        backoff_max_s=max(args.backoff_max, args.backoff),
    )
    say = watch.printer(cfg.PAIR_ID)
    common = ["--env-file", args.env_file, "--recipe", args.recipe]
    base = lc.endpoint(cfg)
    dog = watch.Watchdog(
        wc,
        probe=lambda: watch.probe_token(base, wc.probe_timeout_s, cfg.VLLM_API_KEY),
        restart=watch.launcher_restart(args.launcher, common, args.timeout, extra, say),
        log=say,
        busy=lambda: watch.lock_busy(lock_path(cfg)),
    )
    what = (
        f"{base}/v1: a 1-token completion every {wc.interval_s:g} s (answer within "
        f"{wc.probe_timeout_s:g} s); after {wc.failures} failures in a row: down, then up "
        f"(up --timeout {args.timeout}); a failed restart waits {wc.backoff_s:g} s, doubling "
        f"up to {wc.backoff_max_s:g} s"
    )
    return watch.serve(dog, what)
