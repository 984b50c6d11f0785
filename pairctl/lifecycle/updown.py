"""``up`` and ``down`` of one pair, in one process: lock, health check, preflight, cleanup,
the headless ranks (rank 1; 3, 2, 1 for a group of four) then rank 0, wait, and the
teardown of a boot that did not finish (on every node: any rank failing tears down all).

The order is the seed launcher's. A boot that fails (a rank dies: exit 4; a boot phase
stalls past its limit, or the --timeout backstop passes: exit 5) or is interrupted (Ctrl-C,
SIGTERM, SIGHUP: exit 130) is torn down before the process exits, so no half-started pair
is left holding memory. ``down`` and ``up`` hold
the pair's lock (``flock`` on a file named after PAIR_ID and SPARK1) for their whole run:
two operators, or an operator and the watchdog, never race on one pair.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from pairctl.contracts import (
    BOOT_POLL_S,
    EXIT_BOOT,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_RUNTIME,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from pairctl.engine.bootwatch import first_boot_reasons
from pairctl.lifecycle import steps as lc
from pairctl.lock import LockHeld, held, pair_lock_path
from pairctl.log import logger
from pairctl.pair.resolved import ResolvedPair

log = logger("dspark_launch: ")


def lock_path(pair: ResolvedPair) -> str:
    return pair_lock_path(pair.pair_id, pair.spark1)


def pair_lock(pair: ResolvedPair) -> AbstractContextManager[None]:
    """Hold the pair's lock for the block; LockHeld (exit 3, nothing started or removed) at
    once when another up/down of this pair runs."""
    return held(lock_path(pair), "up/down for this pair")


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP during a boot: handled everywhere exactly as Ctrl-C is."""


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Interrupted`` in this block (restored after), so a boot is
    torn down on them exactly as on Ctrl-C."""

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def every_node(pair: ResolvedPair) -> str:
    """ "both nodes" for a pair, "all N nodes" for a group (the log lines say which)."""
    return "both nodes" if pair.nnodes == 2 else f"all {pair.nnodes} nodes"


def start_order(pair: ResolvedPair) -> tuple[int, ...]:
    """The headless ranks first, highest first, then the head (rank 0): every worker waits
    in distributed init before the head opens its store (tonyd2wild
    launch/tp4-4x-spark-launch.sh, "STARTUP ORDER")."""
    return (*reversed(pair.headless_ranks), 0)


def teardown(pair: ResolvedPair) -> None:
    log(f"tearing down pair containers on {every_node(pair)}")
    if lc.cleanup(pair) != EXIT_OK:
        log("teardown incomplete: run 'launch/dspark_launch.sh down' once the node answers")


def boot(pair: ResolvedPair, timeout_s: float, poll_s: float = BOOT_POLL_S) -> int:
    """Cleanup, the headless ranks, rank 0, wait; anything but healthy is torn down (4, 5
    or 130).

    Before anything starts, the JIT caches say whether this is a first boot (longer phase
    limits, pairctl.contracts.BOOT_PHASES) or a warm one."""
    with signals_interrupt():
        try:
            cold = first_boot_reasons(pair)
            if cold:
                log(f"first boot ({'; '.join(cold)}): first-boot phase limits, ~10 min")
            else:
                log(f"warm boot (JIT caches filled on {every_node(pair)}): warm-boot phase limits")
            if lc.cleanup(pair) != EXIT_OK:
                log("could not remove this pair's stale containers; nothing new was started")
                return EXIT_BOOT
            boot_id = secrets.token_hex(6)  # this boot's identity (pairctl.status.ownership)
            ranks = "both ranks" if pair.nnodes == 2 else "every rank"
            log(f"boot id {boot_id} (label dsv4.boot on {ranks})")
            for rank in start_order(pair):
                if lc.start_rank(pair, rank, boot_id) != EXIT_OK:
                    log(f"rank {rank} did not start")
                    teardown(pair)
                    return EXIT_BOOT
            rc = lc.wait_healthy(pair, timeout_s, poll_s=poll_s, first_boot=bool(cold))
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP as Interrupted
            log("interrupted during boot")
            teardown(pair)
            raise
    if rc != EXIT_OK:
        teardown(pair)
        return EXIT_TIMEOUT if rc == EXIT_TIMEOUT else EXIT_BOOT
    return EXIT_OK


def up(
    pair: ResolvedPair,
    timeout_s: float,
    preflight: Callable[[ResolvedPair], int],
    healthy: Callable[[ResolvedPair], bool],
    gate: Callable[[ResolvedPair], int] | None = None,
    poll_s: float = BOOT_POLL_S,
) -> int:
    """The whole ``up``: nothing is started unless preflight passed under the pair's lock."""
    try:
        with pair_lock(pair):
            if not healthy(pair):
                rc = preflight(pair)
                if rc != EXIT_OK:
                    if rc not in (EXIT_PREFLIGHT, EXIT_USAGE):
                        log(f"preflight could not run (rc={rc}); nothing was started or removed")
                        rc = EXIT_PREFLIGHT
                    return rc
                rc = boot(pair, timeout_s, poll_s)
                if rc != EXIT_OK:
                    return rc
    except LockHeld as exc:
        log(str(exc))
        return EXIT_PREFLIGHT
    return gate(pair) if gate is not None else EXIT_OK


def down(pair: ResolvedPair) -> int:
    """Remove this pair's containers on every node (label-selected), under its lock."""
    try:
        with pair_lock(pair):
            if lc.cleanup(pair) != EXIT_OK:
                log("down incomplete (a node did not answer); re-run once it does")
                return EXIT_RUNTIME
    except LockHeld as exc:
        log(str(exc))
        return EXIT_PREFLIGHT
    print("pair down: no containers of this pair remain")
    return EXIT_OK
