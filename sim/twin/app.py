"""Rank 0's API server: wire profile + args into engine, metrics and HTTP, then serve.

Called by `serve` once the boot phases are done; it never imports `serve`."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from sim.twin import LABEL, peerloss
from sim.twin import faults as faultmod
from sim.twin import profile as profmod
from sim.twin.api import TwinServer
from sim.twin.boot import api_server_ready, api_server_up
from sim.twin.cli import ServeArgs
from sim.twin.engine import Engine, EngineConfig, PeerStep
from sim.twin.lifecycle import ROLE, die, fault_at, write_marker
from sim.twin.metrics import Metrics
from sim.twin.overlay_flags import fp8_head_enabled
from sim.twin.prefix_cache import PrefixCache
from sim.twin.prompting import PromptEncoder
from sim.twin.requests_in import Builder

log = logging.getLogger("twin")


def step_timeout(tp: int) -> float | None:
    """VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (default 300), enforced only with TP > 1."""
    if tp <= 1:
        return None
    raw = os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300")
    try:
        return float(raw)
    except ValueError:
        log.warning("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=%r is not a number; using 300", raw)
        return 300.0


def engine_config(
    args: ServeArgs, prof: profmod.Profile, faults: faultmod.Faults, warm: bool
) -> EngineConfig:
    sched, kv = prof.section("scheduler"), prof.section("kv_cache")
    return EngineConfig(
        gamma=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs or int(sched.get("max_num_seqs", 256)),
        max_num_batched_tokens=args.max_num_batched_tokens
        or int(sched.get("max_num_batched_tokens", 8192)),
        lpt_threshold=max(int(args.long_prefill_token_threshold or 0), 0),
        max_model_len=args.max_model_len or int(sched.get("max_model_len", 1048576)),
        fp8_head=fp8_head_enabled(),
        kv_capacity_tokens=int(kv.get("capacity_tokens", 1_200_000)),
        step_timeout_s=step_timeout(args.tensor_parallel_size),
        jit_stall_s=0.0 if warm else float(prof.section("boot").get("jit_stall_s", 0.0)),
        stall_steps=dict(faults.stalls),
    )


def truth(
    args: ServeArgs,
    prof: profmod.Profile,
    cfg: EngineConfig,
    seed: int,
    warm: bool,
    encoder_cached: bool,
) -> dict[str, Any]:
    derived = profmod.derived(
        prof,
        cfg.gamma,
        cfg.fp8_head,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.lpt_threshold,
    )
    derived.update(
        {
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "long_prefill_token_threshold": cfg.lpt_threshold,
            "max_model_len": cfg.max_model_len,
            "step_timeout_s": cfg.step_timeout_s,
            "jit_stall_s": cfg.jit_stall_s,
            "warm_boot": warm,
            "incremental_encode_cache": encoder_cached,
            "seed": seed,
            "kv_capacity_tokens": cfg.kv_capacity_tokens,
        }
    )
    serve = args.shown()  # the key as *** (vLLM's redact_sensitive_args)
    return {
        "simulator": LABEL,
        "profile": {k: v for k, v in prof.raw.items()},
        "derived": derived,
        "serve_args": serve,
        "unknown_flags": args.unknown_flags,
    }


def start_server(
    args: ServeArgs,
    prof: profmod.Profile,
    faults: faultmod.Faults,
    warm: bool,
    encoder: PromptEncoder | None = None,
    sock: socket.socket | None = None,
    peer: PeerStep | None = None,
) -> int:
    seed = args.twin_seed if args.twin_seed is not None else args.seed
    cfg = engine_config(args, prof, faults, warm)
    names = list(args.served_model_name or [args.model])
    kv = prof.section("kv_cache")
    prefix = PrefixCache(
        int(kv.get("block_size", 256)),
        int(kv.get("prefix_cache_blocks", 4688)),
        enabled=bool(args.enable_prefix_caching),
    )
    metrics = Metrics(names[0], cfg.gamma)

    died_at: list[float] = []

    def on_death(why: str) -> None:
        died_at.append(time.monotonic() + peerloss.exit_delay(server.open_streams))
        if engine.peer_lost is not None or engine.clean_shutdown:
            # a lost TP peer or a step timeout: vLLM's API server shuts itself down cleanly
            # and exits 0 (peerloss.py)
            threading.Thread(target=_stop_serving, args=(server,), daemon=True).start()
            return
        # Like vLLM's API server: in-flight requests get their error, /health turns 503,
        # then the process exits non-zero (and the peer rank follows via the heartbeat).
        threading.Timer(1.0, die, args=(f"EngineDeadError: {why}; shutting down",)).start()

    engine = Engine(
        prof,
        cfg,
        metrics,
        prefix,
        on_death=on_death,
        on_first_step=None if warm else write_marker,
        peer=peer,
    )
    encoder = encoder or PromptEncoder()
    builder = Builder(
        engine,
        encoder,
        prof,
        seed,
        cfg.gamma,
        cfg.max_model_len,
        prefix.block_size,
        answers_enabled=not faults.no_answers,
        draft_faults=faults.draft,
    )
    try:
        server = TwinServer(
            (args.host, args.port),
            engine,
            builder,
            metrics,
            names,
            truth(args, prof, cfg, seed, warm, encoder.cached),
            pair_id=args.twin_pair_id,
            api_keys=args.api_key,
            sock=sock,
        )
    except OSError as exc:
        # Without a pre-bound socket (unit use): vLLM binds the port in setup_server
        # (vllm/entrypoints/launchers/launcher.py); the traceback ends in the OSError.
        print(f"OSError: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr, flush=True)
        return 1
    engine.start()
    time.sleep(float(prof.section("boot").get("api_server_s", 0.0)) * faults.slow_boot)
    api_server_up(args)
    for n, at, dur in faults.foreign:
        threading.Timer(at, _inject, args=(engine, builder, n, dur)).start()
    fault_at(faults, "serving")
    api_server_ready()
    ROLE.on_peer_lost = engine.lose_peer
    ROLE.serving = True
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        engine.stop()
    if died_at:  # the engine died of a lost peer: the engine client's cleanup, exit 0
        time.sleep(max(died_at[0] - time.monotonic(), 0.0))
        peerloss.engine_client_down()
    return 0


def _stop_serving(server: TwinServer) -> None:
    """uvicorn exits a moment after the engine died: the failed requests have their 500
    and a /health probe sees 503 first, then the socket closes."""
    time.sleep(0.3)
    peerloss.http_down()
    server.shutdown()
    server.server_close()


def _inject(engine: Engine, builder: Builder, n: int, secs: float) -> None:
    log.warning("Foreign traffic (fault switch): %d phantom requests for %.1f s", n, secs)
    for i in range(n):
        engine.submit(builder.foreign(secs, i))
