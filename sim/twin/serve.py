"""`serve`: boot like a vLLM rank (its log lines, rendezvous, faults), then serve HTTP on
rank 0. What each rank prints, and in which order, is `boot`'s (vLLM 0.33's own lines)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sim.twin import LABEL, boot
from sim.twin import faults as faultmod
from sim.twin import profile as profmod
from sim.twin.app import start_server
from sim.twin.cli import ServeArgs, UsageError, build_parser, parse_serve_args
from sim.twin.lifecycle import (
    MARKER,
    ROLE,
    die,
    exit_on_sigterm,
    fault_at,
    setup_logging,
    tilelang_dir,
    write_marker,
)
from sim.twin.prompting import PromptEncoder
from sim.twin.ranks import Group, Link, RendezvousError, join_rendezvous, serve_group
from sim.twin.thinking import MODELLED_PARSERS
from sim.twin.vllm_log import emit

log = logging.getLogger("twin")


def run(argv: list[str]) -> int:
    """Entry point of `python -m sim.twin serve ...`."""
    setup_logging()
    ROLE.headless = "--headless" in argv
    exit_on_sigterm()
    log.info(
        "%s: simulated DeepSeek-V4-Flash + DSpark pair; no model runs here (pid %d)",
        LABEL,
        os.getpid(),
    )
    try:
        args = parse_serve_args(argv)
        prof = profmod.load(args.twin_profile)
        rank = args.node_rank if args.nnodes > 1 else 0
        faults = faultmod.parse(args.twin_fault, rank)
    except (UsageError, profmod.ProfileError, faultmod.FaultSpecError) as exc:
        log.error("%s", exc)
        return 2
    ROLE.headless = bool(args.headless or rank >= 1)
    for flag in args.unknown_flags:  # names only: a value may be a secret
        log.warning("ignoring unknown flag %s (the twin accepts it; vLLM might not)", flag)
    for key in args.config_unknown:
        log.warning("ignoring unknown key %r in --config %s", key, args.config)
    if args.reasoning_parser and args.reasoning_parser not in MODELLED_PARSERS:
        log.warning(
            "--reasoning-parser %s: the twin models only %s's split; replies are not split",
            args.reasoning_parser,
            "/".join(MODELLED_PARSERS),
        )
    warm = warm_boot()
    log.info(
        "profile %s (%s); TileLang cache %s: %s boot",
        prof.name,
        prof.raw.get("_path"),
        tilelang_dir(),
        "warm (marker found)" if warm else "cold (no marker)",
    )
    if faults.spec:
        log.warning("fault switch active: %s", faults.spec)
    encoder = None
    sock: list[socket.socket] = []
    if ROLE.headless:
        boot.headless_preamble(args)
    else:
        boot.head_preamble(args, prof, _non_default(args), lambda: sock.append(bind_port(args)))
        # Loading the real tokenizer takes ~1 s of CPU: overlap it with the boot phases.
        encoder = ThreadPoolExecutor(1, thread_name_prefix="tok-load").submit(PromptEncoder)
    t0 = time.monotonic()
    link = _rendezvous(args, prof, faults, rank)
    fault_at(faults, "joined")
    boot.worker_phases(args, prof, faults, rank, warm)
    if ROLE.headless:
        return _headless(link)
    if link is not None:
        while not link.event("ready").wait(1.0):  # the engine core waits for every worker
            pass
    compile_s = float(
        (prof.section("boot").get("warm" if warm else "cold") or {}).get("compiling_s", 0.0)
    )
    boot.engine_ready(time.monotonic() - t0, compile_s * faults.slow_boot)
    return start_server(
        args, prof, faults, warm, encoder.result() if encoder else None, sock[0], link
    )


def bind_port(args: ServeArgs) -> socket.socket:
    """The API port, bound (not yet listening) before the engine boots, as vLLM's
    ``create_server_socket`` does (SO_REUSEADDR, then bind). A taken port ends the process
    with exit 1 and the line vLLM's traceback ends in (``OSError: [Errno 98] Address
    already in use``), before any model-loading time is spent."""
    family = socket.AF_INET6 if ":" in (args.host or "") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host or "", args.port))
    except OSError as exc:
        sock.close()
        print(f"OSError: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr, flush=True)
        die(None)
    return sock


def warm_boot() -> bool:
    """A TileLang cache marker from an earlier boot (written after the first engine step)."""
    return (tilelang_dir() / MARKER).is_file()


def _non_default(args: ServeArgs) -> dict[str, Any]:
    """vLLM logs the serve args that differ from their defaults (startup.py)."""
    defaults = vars(build_parser().parse_args([]))
    skip = {"twin_profile", "twin_seed", "twin_fault", "model_flag", "num_speculative_tokens"}
    return {
        ("model_tag" if k == "model" else k): v
        for k, v in args.shown().items()
        if k not in skip and args.as_dict()[k] != defaults.get(k)
    }


def _rendezvous(
    args: ServeArgs, prof: profmod.Profile, faults: faultmod.Faults, rank: int
) -> Group | Link | None:
    """The worker's torch.distributed init: one node needs nobody; N nodes wait until all
    are in (the head holds a link to each, a headless rank one to the head)."""
    boot.dist_init(args, rank)
    fault_at(faults, "rendezvous")
    if args.nnodes == 1:
        boot.rank_assigned(args, rank)
        return None
    dist = prof.section("distributed")
    timeout = float(dist.get("join_timeout_s", 900))
    interval = float(dist.get("heartbeat_interval_s", 0.5))
    try:
        if rank == 0:
            joined = serve_group(
                args.master_addr, args.master_port, args.model, timeout, args.nnodes
            )
        else:
            sock = join_rendezvous(args.master_addr, args.master_port, args.model, timeout, rank)
    except RendezvousError as exc:
        if str(exc).startswith("torch."):
            # how vLLM reports it: the worker's exception log, then the exception itself
            emit("Worker", "worker_failed_start")
            print(str(exc), file=sys.stderr, flush=True)
            die(None)
        die(str(exc))
        raise  # unreachable; keeps type checkers happy
    boot.rank_assigned(args, rank)
    ROLE.joined = True
    if rank != 0:
        peer = f"{args.master_addr}:{args.master_port}"
        link = Link(sock, 0, interval, lambda why: _peer_gone(why, peer))
        link.start()
        return link
    group = Group({})
    for r, (conn, hello) in joined.items():
        group.links[r] = Link(conn, r, interval, _on_rank_death(group, r, hello["peer"], args))
    group.links = dict(sorted(group.links.items()))
    group.start()
    return group


def _on_rank_death(group: Group, rank: int, peer: str, args: ServeArgs) -> Callable[[str], None]:
    """What the head does when rank ``rank``'s socket closes: a ring neighbour of the head
    (rank 1 or N-1; a pair's rank 1) is a lost peer (``_peer_gone``); any other rank of a
    larger group hangs the head's next step (ranks.Group.hang, as measured)."""
    if rank in (1, args.nnodes - 1):
        return lambda why: _peer_gone(why, peer)
    return lambda _why: group.hang(rank)


def _peer_gone(why: str, peer: str) -> None:
    """Another rank's socket closed (a frozen rank's does not: ranks.py), as vLLM 0.32
    reacts (measured; see docs/simulator.md "Peer loss and shutdown"):
    - a headless rank (1..N-1): nothing. Its worker waits on the head's message queue forever; the
      process never exits (vllm/v1/executor/multiproc_executor.py, the headless worker
      loop has no peer check).
    - rank 0 serving: nothing yet; the next engine step fails (sim/twin/peerloss.py).
    - rank 0 still booting: the boot's next collective fails; the twin exits 1 at once.
    """
    if ROLE.headless:
        return
    if ROLE.on_peer_lost is not None:
        ROLE.on_peer_lost(peer)
        return
    die(f"TP peer lost: {why}; shutting down this rank")


def _headless(link: Group | Link | None) -> int:
    """A headless rank: tell rank 0 we are ready, then live as long as the group does."""
    if isinstance(link, Link):
        link.send({"type": "ready"})
    write_marker()
    while True:
        time.sleep(3600)
