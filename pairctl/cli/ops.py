"""The operator's commands besides up/down: status, logs, the gate, watch and sync-overlays
(each gets the parsed command line and the resolved pair from ``pairctl.cli.main``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pairctl import preflight as pf
from pairctl.cli.frontdoor import Args
from pairctl.contracts import (
    EXIT_GATE,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_RUNTIME,
    STATUS_INTERVAL_S,
    STATUS_REFRESH_S,
    WATCH_INTERVAL_S,
)
from pairctl.engine.overlays import sync
from pairctl.gate import run_for_pair
from pairctl.lifecycle.updown import lock_path
from pairctl.lock import busy as lock_busy
from pairctl.log import log
from pairctl.nodes.docker import pair_containers
from pairctl.pair.config import ConfigError
from pairctl.pair.plan import container_name
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight import group as pfgroup
from pairctl.sentinel.pair import check_at_up, pair_monitors
from pairctl.status import memory, ownership, watch
from pairctl.status import pair as pst
from pairctl.status import view as status_view
from pairctl.status.memwatch import NodeWatch

# What sync-overlays must know before it writes to two machines: that this is SPARK1 and
# SPARK2 is another machine (the checks, and the exit code, with which up refuses).
IDENTITY_CHECKS = ("PF-SELF-IS-SPARK1", "PF-DISTINCT-NODES")


def print_check(check: pf.Check) -> None:
    sys.stdout.write(pf.render_check(check))
    sys.stdout.flush()


def progress(msg: str) -> None:
    log(f"preflight: {msg}...")


def status(a: Args, pair: ResolvedPair) -> int:
    """Exit 0 healthy, 7 degraded, 8 down (with --watch: the last reading's; Ctrl-C 130)."""
    if a.watch:
        interval = a.interval if a.interval is not None else STATUS_REFRESH_S

        def reading(prev: pst.MetricsSample | None):
            return pst.collect(pair, prev, interval)

        return status_view.watch(reading, interval, a.count, as_json=a.json)
    interval = a.interval if a.interval is not None else STATUS_INTERVAL_S
    st = pst.pair_status(pair, interval_s=interval, on_window=window_started)
    text = status_view.render_json(st) + "\n" if a.json else status_view.render_text(st)
    sys.stdout.write(text)
    return st.exit_code


# A rate window this long is a wait a person notices: status says when it starts.
STATUS_SAY_WINDOW_S = 3.0


def window_started(interval_s: float) -> None:
    """Progress on a long wait: the first /metrics scrape is in, the window runs now."""
    if interval_s >= STATUS_SAY_WINDOW_S:
        log(f"status: measuring the serving rates over {interval_s:g} s...")


def sync_overlays(a: Args, pair: ResolvedPair) -> int:
    """Refuse, as up does (exit 3), unless this is SPARK1 and SPARK2 is another machine."""
    if not on_spark1("sync-overlays", pair):
        return EXIT_PREFLIGHT
    return sync(pair.nodes, pair.overlay_dir, Path(a.src))


def on_spark1(what: str, pair: ResolvedPair) -> bool:
    """The identity checks up runs (this machine is SPARK1, every other SPARK another
    machine: each headless rank's, in a group), printed."""
    specs = tuple(pf.BY_ID[i] for i in IDENTITY_CHECKS)
    checks, _ = pfgroup.run(
        pair, {}, print_check, progress, say=log, specs=specs, probe_rank1=False
    )
    if pf.failed(checks):
        log(f"{what} refused: run it on this pair's rank-0 node; nothing was copied")
        return False
    return True


def transfer(a: Args, pair: ResolvedPair) -> int:
    """``image ship`` / ``model fetch|verify``: refuse off SPARK1 (exit 3), as sync does."""
    from pairctl.engine import imageship
    from pairctl.nodes import modelfetch

    if a.cmd == "model" and a.action == "fetch":
        modelfetch.repo_and_revision(pair)  # an unpinned commit is exit 2, before any probe
    if not on_spark1(f"{a.cmd} {a.action}", pair):
        return EXIT_PREFLIGHT
    if a.cmd == "image":
        return imageship.ship(pair, build=a.build, pull=a.pull, stage=a.stage)
    if a.action == "verify":
        return modelfetch.verify(pair, checksum=a.checksum)
    return modelfetch.fetch(
        pair,
        checksum=a.checksum,
        skip_download=a.skip_download,
        downloader_cmd=a.downloader,
    )


def logs(a: Args, pair: ResolvedPair) -> int:
    """One rank's container log. A node that cannot be asked, or no container, is a message
    and exit 1 (never ssh's bare 255)."""
    if a.rank >= pair.nnodes:
        raise ConfigError(
            f"--rank {a.rank}: this pair has ranks 0-{pair.nnodes - 1} (SPARK3/SPARK4 make a "
            "group of four)"
        )
    node = pair.nodes[a.rank]
    name = container_name(pair.pair_id, a.rank)
    via = " over ssh" if node.remote else ""
    found, res = pair_containers(node, pair.pair_id)
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
    if a.tail is not None:
        argv += ["--tail", str(a.tail)]
    if a.follow:
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


def gate(pair: ResolvedPair) -> int:
    """The post-up quality gate, then the acceptance probe (recorded where the pair's key
    has no record yet, else judged against it: pairctl.sentinel.pair.check_at_up), in this
    process; the endpoint stays up either way."""
    rc = run_for_pair(pair.endpoint, pair.api_key)  # the key in headers, no proxy
    if rc != EXIT_OK:
        log(f"quality gate FAILED against {pair.endpoint} (endpoint left running for inspection)")
        return EXIT_GATE
    print("quality gate passed")
    ok, line = check_at_up(pair, log)
    if not ok:
        log(f"{line} (endpoint left running for inspection)")
        return EXIT_GATE
    print(line)
    return EXIT_OK


def watchdog(a: Args, pair: ResolvedPair, restart: Callable[[], int]) -> int:
    """Run the watchdog until SIGTERM (exit 0) or Ctrl-C (exit 130)."""
    wc = watch.WatchConfig(
        interval_s=a.interval if a.interval is not None else WATCH_INTERVAL_S,
        failures=a.failures,
        probe_timeout_s=a.probe_timeout,
        backoff_s=a.backoff,
        backoff_max_s=max(a.backoff_max, a.backoff),
    )
    say = watch.printer(pair.pair_id)
    base = pair.endpoint
    mon = pair_monitors(pair, a.canary_every, a.probe_every, say)
    identity = pair.stack.boot_identity == "fingerprint"
    prover = ownership.Prover(
        base, wc.probe_timeout_s, pair.api_key, pair.pair_id, identity, pair.nodes[0]
    )
    dog = watch.Watchdog(
        wc,
        probe=prover.probe,
        owner=prover.foreign,
        restart=restart,
        log=say,
        busy=lambda: lock_busy(lock_path(pair)),
        nodes=NodeWatch(lambda: memory.sample(pair.nodes), say),
        after_ok=mon.after_ok_probe,
    )
    canary = f"every {a.canary_every:g} s" if a.canary_every else "off"
    probe = f"every {a.probe_every:g} s" if a.probe_every else "off"
    n = len(pair.nodes)  # 2 for a pair, 4 for a group (a test may pass a stand-in)
    nodes = "both nodes'" if n == 2 else f"all {n} nodes'"
    ssh = "rank 1's ssh" if n == 2 else "every headless rank's ssh"
    what = (
        f"{base}/v1: a 1-token completion every {wc.interval_s:g} s (answer within "
        f"{wc.probe_timeout_s:g} s); after {wc.failures} failures in a row: down, then up "
        f"(up --timeout {a.timeout}); a failed restart waits {wc.backoff_s:g} s, doubling "
        f"up to {wc.backoff_max_s:g} s; {nodes} memory read each cycle; a restart waits "
        f"for {ssh} to answer. Acceptance probe {probe}, output canary {canary}: "
        "events only, never a restart. Nothing is done against a server not proven this "
        "pair's ("
        + ("its system_fingerprint names this boot" if identity else "labels only: weaker")
        + ")"
    )
    return watch.serve(dog, what)
