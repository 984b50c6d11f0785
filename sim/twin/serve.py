"""`serve`: boot like a vLLM rank (phases, rendezvous, faults), then serve HTTP on rank 0."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sim.twin import LABEL
from sim.twin import faults as faultmod
from sim.twin import profile as profmod
from sim.twin.app import start_server
from sim.twin.cli import ServeArgs, UsageError, parse_serve_args
from sim.twin.lifecycle import (
    MARKER,
    die,
    exit_on_sigterm,
    fault_at,
    setup_logging,
    tilelang_dir,
    write_marker,
)
from sim.twin.prompting import PromptEncoder
from sim.twin.ranks import Link, RendezvousError, join_rendezvous, serve_rendezvous

log = logging.getLogger("twin")
PHASE_LINES = (
    ("loading", "loading_weights_s", "Loading weights"),
    ("compiling", "compiling_s", "Compiling"),
    ("graphs", "capturing_graphs_s", "Capturing CUDA graphs"),
)


def boot(prof: profmod.Profile, faults: faultmod.Faults) -> bool:
    """Run the boot phases; returns True if this was a warm (cached) boot."""
    bootcfg = prof.section("boot")
    warm = (tilelang_dir() / MARKER).is_file()
    phases = bootcfg.get("warm" if warm else "cold") or {}
    log.info(
        "TileLang cache %s: %s boot",
        tilelang_dir(),
        "warm (marker found)" if warm else "cold (no marker)",
    )
    for key, field, line in PHASE_LINES:
        fault_at(faults, key)
        secs = float(phases.get(field, 0.0)) * faults.slow_boot
        log.info("%s (%.1f s)", line, secs)
        time.sleep(secs)
    return warm


def run(argv: list[str]) -> int:
    """Entry point of `python -m sim.twin serve ...`."""
    rank_guess = 1 if "--headless" in argv else 0
    setup_logging(rank_guess)
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
    setup_logging(rank)
    for flag in args.unknown:
        log.warning("ignoring unknown flag %s (the twin accepts it; vLLM might not)", flag)
    for key in args.config_unknown:
        log.warning("ignoring unknown key %r in --config %s", key, args.config)
    log.info(
        "profile %s (%s); args: %s",
        prof.name,
        prof.raw.get("_path"),
        {k: v for k, v in args.as_dict().items() if v not in (None, False)},
    )
    if faults.spec:
        log.warning("fault switch active: %s", faults.spec)
    dist = prof.section("distributed")
    link = None
    if args.nnodes > 1:
        link = _rendezvous(args, prof, faults, dist)
    fault_at(faults, "joined")
    encoder = None
    if rank == 0 and not args.headless:
        # Loading the real tokenizer takes ~1 s of CPU: overlap it with the boot phases.
        encoder = ThreadPoolExecutor(1, thread_name_prefix="tok-load").submit(PromptEncoder)
    warm = boot(prof, faults)
    if rank == 1 or args.headless:
        return _headless(link)
    if link is not None:
        log.info("Waiting for rank 1 to finish loading")
        while not link.event("ready").wait(1.0):
            pass
    return start_server(args, prof, faults, warm, encoder.result() if encoder else None)


def _rendezvous(
    args: ServeArgs, prof: profmod.Profile, faults: faultmod.Faults, dist: dict[str, Any]
) -> Link:
    fault_at(faults, "rendezvous")
    timeout = float(dist.get("join_timeout_s", 900))
    try:
        if args.node_rank == 0:
            sock, _ = serve_rendezvous(args.master_addr, args.master_port, args.model, timeout)
            peer = 1
        else:
            sock = join_rendezvous(args.master_addr, args.master_port, args.model, timeout)
            peer = 0
    except RendezvousError as exc:
        die(str(exc))
        raise  # unreachable; keeps type checkers happy
    link = Link(
        sock,
        peer,
        float(dist.get("heartbeat_interval_s", 0.5)),
        float(dist.get("heartbeat_timeout_s", 10.0)),
        lambda why: die(f"TP peer lost: {why}; shutting down this rank"),
    )
    link.start()
    return link


def _headless(link: Link | None) -> int:
    """Rank 1: tell rank 0 we are ready, then live as long as the pair does."""
    if link is not None:
        link.send({"type": "ready"})
    log.info("Worker ready (headless rank 1): the API is served by rank 0")
    write_marker()
    while True:
        time.sleep(3600)
