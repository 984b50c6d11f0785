"""``python -m pairctl.sentinel record``: record a recipe's acceptance baseline band.

Two sources, each a window of the pair's spec-decode counters: the quality gate's prompts
(``pairctl/gate/quality_ref_dspark.json``) asked ``--gate-rounds`` times in thinking mode
(reasoning text gives hundreds of drafts a prompt, where the bare answers give a few;
only the drafts matter here, so a reply that is all reasoning, ``max_tokens`` spent before
the answer, is logged and counted, never fatal: ``pairctl.gate.reply``), and
then ``--live-s`` seconds of whatever traffic the pair serves, cut into ``--window-s``
windows. A window with at least ``--min-drafts`` drafts is an observation; the band is the
lowest of each figure less ``--margin`` (pairctl.sentinel.baseline). Nothing is written
unless the whole recording succeeded; Ctrl-C writes nothing (exit 130).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pairctl.cli import argtypes, options
from pairctl.contracts import SENTINEL_EXITS, codes, exit_line
from pairctl.endpoint import Endpoint, NotReady, endpoint_arg, wait_ready
from pairctl.gate.check import DEFAULT_PROMPTS, ask_reply, load_reference
from pairctl.log import log
from pairctl.sentinel import baseline
from pairctl.sentinel.acceptance import (
    DEFAULT_MIN_DRAFTS,
    DEFAULT_MIN_TRIALS,
    Counters,
    counters_of,
    shape,
)
from pairctl.status.metrics import MetricsParseError, fetch, parse

EPILOG = exit_line(SENTINEL_EXITS)
_EXIT = codes(SENTINEL_EXITS)
EXIT_OK, EXIT_FAILED = _EXIT["EXIT_OK"], _EXIT["EXIT_FAILED"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]


# The shortest live window: each one is a /metrics scrape and a log line.
MIN_WINDOW_S = 1.0


class RecordError(RuntimeError):
    """The recording cannot go on; the message says what to do."""


def read_counters(session: Any, endpoint: Endpoint) -> Counters:
    import requests

    try:
        c = counters_of(parse(fetch(session, endpoint.base, timeout=10)))
    except (requests.RequestException, MetricsParseError) as exc:
        raise RecordError(f"GET {endpoint.url('/metrics')}: {exc}") from None
    if c is None:
        raise RecordError(
            "the server exports no vllm:spec_decode_* counters: speculative decoding is off "
            "(the recipe's speculative-config), so there is nothing to record"
        )
    return c


def gate_rounds_load(
    session: Any, endpoint: Endpoint, model: str, rounds: int, max_tokens: int
) -> int:
    """Ask the gate's prompts ``rounds`` times in thinking mode; how many replies were all
    reasoning (logged, not fatal: their drafts count). RecordError when one was not answered."""
    ref = load_reference(str(DEFAULT_PROMPTS))
    all_reasoning = 0
    for i in range(rounds):
        for spec in ref["prompts"]:
            log(f"gate round {i + 1}/{rounds}: {spec['name']}")
            reply, err = ask_reply(session, endpoint, model, spec, max_tokens, True, 600.0)
            if reply is None:
                raise RecordError(f"gate prompt {spec['name']}: {err}")
            if reply.all_reasoning:
                all_reasoning += 1
                log(f"gate prompt {spec['name']}: {reply.no_answer()} (its drafts count)")
    return all_reasoning


def record(
    session: Any,
    endpoint: Endpoint,
    gate_rounds: int,
    max_tokens: int,
    live_s: float,
    window_s: float,
    min_drafts: int,
    sleep: Callable[[float], None] = time.sleep,
    key_from: str = "VLLM_API_KEY",
) -> tuple[list[dict[str, Any]], int, str, bool]:
    """(observations, positions, model, simulator) from the gate rounds and live windows;
    ``key_from`` is where the key came from, for a 401's hint."""
    try:
        ident = wait_ready(session, endpoint, 30.0, log, key_from=key_from)
    except NotReady as exc:
        raise RecordError(str(exc)) from None
    obs: list[dict[str, Any]] = []

    def close(source: str, start: Counters, t0: float) -> Counters:
        now = read_counters(session, endpoint)
        s = shape(now.minus(start))
        o = baseline.observation(source, s, time.monotonic() - t0)
        o["used"] = s.drafts >= min_drafts and s.depth_ratio is not None
        obs.append(o)
        r = "-" if s.depth_ratio is None else f"{s.depth_ratio:.3f}"
        log(
            f"{source}: {s.drafts:.0f} drafts, depth ratio {r}"
            + ("" if o["used"] else " (too few drafts: not used)")
        )
        return now

    start = read_counters(session, endpoint)
    if gate_rounds:
        t0 = time.monotonic()
        n = gate_rounds_load(session, endpoint, ident.model, gate_rounds, max_tokens)
        start = close("gate", start, t0)
        obs[-1]["all_reasoning_replies"] = n
    t_end = time.monotonic() + live_s
    while time.monotonic() < t_end - 1e-3:
        t0 = time.monotonic()
        left = min(window_s, t_end - t0)
        log(f"live traffic: window of {left:.0f} s ({t_end - t0:.0f} s left)")
        sleep(left)
        start = close("live", start, t0)
    return obs, len(start.per_pos), ident.model, ident.simulator


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    """The flags (``add_cli_args``) and the rules between them (exit 2 naming the fix)."""
    a, p = options.namespace(
        argv,
        add_cli_args,
        prog="python -m pairctl.sentinel record",
        description="Record the acceptance baseline band of a recipe from the quality gate's "
        "prompts and live traffic, into the recipe's baseline file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    if a.margin >= 1:
        options.usage_error(p, f"--margin must be below 1, got {a.margin}")
    if a.gate_rounds == 0 and a.live_s == 0:
        options.usage_error(p, "nothing to record: give --gate-rounds > 0 or --live-s > 0")
    if (a.env_file is None) == (a.url is None):
        options.usage_error(
            p, "name the pair with --env-file FILE, or an endpoint with --url URL (one of them)"
        )
    return a


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """record's flags onto ``p`` (the exit codes as its epilog)."""
    p.epilog = EPILOG
    options.add_pair_files(
        p, "the pair's env file: its endpoint and key", "the recipe (default: the launcher's)"
    )
    p.add_argument("--url", type=endpoint_arg(), default=None, help="endpoint, without --env-file")
    p.add_argument(
        "--gate-rounds", type=argtypes.int_at_least(0), default=3, help="gate prompt rounds"
    )
    p.add_argument(
        "--max-tokens", type=argtypes.int_at_least(16), default=512, help="per gate prompt"
    )
    p.add_argument(
        "--live-s", type=argtypes.seconds(0, inclusive=True), default=0.0, help="live seconds"
    )
    p.add_argument(
        "--window-s",
        type=argtypes.seconds(MIN_WINDOW_S, inclusive=True),
        default=300.0,
        help=f"live window (at least {MIN_WINDOW_S:g} s: one log line per window)",
    )
    p.add_argument("--margin", type=argtypes.float_above(0, True), default=baseline.DEFAULT_MARGIN)
    p.add_argument("--min-drafts", type=argtypes.int_at_least(1), default=DEFAULT_MIN_DRAFTS)
    p.add_argument("--min-trials", type=argtypes.int_at_least(1), default=DEFAULT_MIN_TRIALS)
    p.add_argument(
        "--out",
        type=argtypes.output_file,
        default=None,
        help="write here (None: baselines/RECIPE_NAME.acceptance.json beside the recipe)",
    )


def endpoint_and_recipe(a: argparse.Namespace) -> tuple[Endpoint, str, str]:
    """(endpoint with key, recipe path, recipe name); ConfigError on a bad file."""
    import os

    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.recipe import load_recipe
    from pairctl.pair.resolved import load

    recipe_file = a.recipe or str(DEFAULT_RECIPE)
    if a.env_file is not None:
        pair = load(a.env_file, recipe_file)
        ep = Endpoint.parse(pair.endpoint).with_auth(pair.api_key)
        return ep, pair.recipe.path, pair.recipe.name
    recipe = load_recipe(recipe_file)
    return a.url.with_auth(os.environ.get("VLLM_API_KEY") or None), recipe.path, recipe.name


def key_source(a: argparse.Namespace) -> str:
    """Where record's key comes from (it has no --api-key: the key stays off command lines)."""
    if a.env_file is not None:
        return f"VLLM_API_KEY in {a.env_file}"
    return "VLLM_API_KEY in the environment (with --url)"


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    from pairctl.pair.config import ConfigError

    a = parse_args(argv)
    try:
        ep, recipe_path, recipe_name = endpoint_and_recipe(a)
    except ConfigError as exc:
        log(f"record: {exc}")
        return EXIT_USAGE
    out = Path(a.out) if a.out else baseline.path_for(recipe_path, recipe_name)
    t_start = datetime.now(UTC)
    try:
        session = ep.session(trust_env=False)
        obs, positions, model, sim = record(
            session,
            ep,
            a.gate_rounds,
            a.max_tokens,
            a.live_s,
            a.window_s,
            a.min_drafts,
            key_from=key_source(a),
        )
        used = [o for o in obs if o["used"]]
        if not used:
            raise RecordError(
                f"no window had {a.min_drafts} drafts: run with traffic on the pair, a longer "
                "--live-s or more --gate-rounds (or a lower --min-drafts); nothing written"
            )
        band = baseline.band_from(used, positions, a.margin, a.min_drafts, a.min_trials)
    except RecordError as exc:
        log(f"record FAILED: {exc}")
        return EXIT_FAILED
    except baseline.BaselineError as exc:
        log(f"record FAILED: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("record: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    recorded = {
        "at": t_start.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "endpoint": ep.base,
        "model": model,
        "simulator": sim,
        "method": {
            "gate_rounds": a.gate_rounds,
            "gate_prompts": str(DEFAULT_PROMPTS.name),
            "gate_max_tokens": a.max_tokens,
            "gate_thinking": True,
            "live_s": a.live_s,
            "window_s": a.window_s,
            "min_drafts": a.min_drafts,
        },
        "positions": positions,
        "observations": obs,
    }
    try:
        baseline.save(out, baseline.document(recipe_name, band, a.margin, recorded))
    except OSError as exc:
        log(f"record FAILED writing {out}: {exc.strerror or exc}")
        return EXIT_FAILED
    sim_note = " (SIMULATOR: this band says nothing about hardware)" if sim else ""
    print(
        f"baseline for {recipe_name} written to {out}{sim_note}: depth ratio floor "
        f"{band.depth_ratio_floor:.3f}, first-position floor {band.first_floor:.3f}, mean "
        f"acceptance length {band.mean_length_range[0]:.2f}-{band.mean_length_range[1]:.2f} "
        f"from {len(used)} window(s)"
    )
    return EXIT_OK
