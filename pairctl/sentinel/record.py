"""``dspark sentinel record`` (``python -m pairctl.sentinel record``): record the acceptance
probe on a pair known to be good.

Each probe prompt (``pairctl/sentinel/probe_prompts.json``: prose, code, an agent's JSON) is
read ``--repeats`` times (pairctl.sentinel.recording) and the record is written for the
pair's key: engine stack, recipe, checkpoint revision (pairctl.sentinel.probefile). An
existing record for that key is replaced: this is the operator saying the pair is good now
(``up --gate`` only ever records where none exists). Nothing is written unless every prompt
was read every time; Ctrl-C writes nothing (exit 130).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pairctl.cli import argtypes, options
from pairctl.contracts import (
    PROBE_ABSOLUTE_MARGIN,
    PROBE_RELATIVE_MARGIN,
    PROBE_REPEATS,
    SENTINEL_EXITS,
    codes,
    exit_line,
)
from pairctl.endpoint import Endpoint, NotReady, endpoint_arg, wait_ready
from pairctl.log import log
from pairctl.sentinel import recording
from pairctl.sentinel.judgement import Margins
from pairctl.sentinel.probe import PROBE_PROMPTS, ProbeSetError, load_set
from pairctl.sentinel.probeclient import ProbeClient
from pairctl.sentinel.probefile import ProbeKey

EPILOG = exit_line(SENTINEL_EXITS)
_EXIT = codes(SENTINEL_EXITS)
EXIT_OK, EXIT_FAILED = _EXIT["EXIT_OK"], _EXIT["EXIT_FAILED"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """record's flags onto ``p`` (the exit codes as its epilog)."""
    p.epilog = EPILOG
    options.add_pair_files(
        p,
        "the pair's env file: its endpoint, key and record key",
        "the recipe (default: the launcher's)",
    )
    add = p.add_argument
    add("--url", type=endpoint_arg(), default=None, help="endpoint, without --env-file")
    add("--stack", default=None, help="with --url: the record key's engine stack; None = fork")
    add("--revision", default=None, help="with --url: the key's revision; None = the recipe's")
    add("--repeats", type=argtypes.int_at_least(2), default=PROBE_REPEATS, help="per prompt")
    add("--prompts", default=str(PROBE_PROMPTS), help="the probe prompts file")
    margin = argtypes.float_above(0, True)
    add("--absolute-margin", type=margin, default=PROBE_ABSOLUTE_MARGIN, help="floor margin")
    add("--relative-margin", type=margin, default=PROBE_RELATIVE_MARGIN, help="x the mean")
    idle = argtypes.seconds(0, inclusive=True)
    add("--busy-wait", type=idle, default=recording.BUSY_WAIT_S, help="s for an idle pair")
    add(
        "--out",
        type=argtypes.output_file,
        default=None,
        help="write here (default: probes/KEY.probe.json beside the env file)",
    )


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    """The flags (``add_cli_args``) and the rules between them (exit 2 naming the fix)."""
    a, p = options.namespace(
        argv,
        add_cli_args,
        prog="python -m pairctl.sentinel record",
        description="Record the acceptance probe (fixed greedy prompts, acceptance per draft "
        "position, repeated) on a pair known to be good, for its stack, recipe and checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    if a.absolute_margin >= 1 or a.relative_margin >= 1:
        options.usage_error(p, "the margins are shares of drafts: give values below 1")
    if (a.env_file is None) == (a.url is None):
        options.usage_error(
            p, "name the pair with --env-file FILE, or an endpoint with --url URL (one of them)"
        )
    if a.env_file is not None and (a.stack is not None or a.revision is not None):
        options.usage_error(p, "--stack and --revision go with --url (the env file names them)")
    if a.url is not None and a.out is None:
        options.usage_error(p, "with --url, say where the record goes: --out FILE")
    return a


def target(a: argparse.Namespace) -> tuple[Endpoint, ProbeKey, Path, str]:
    """(endpoint with key, record key, record path, plan hash); ConfigError on a bad file."""
    import os

    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.recipe import load_recipe
    from pairctl.pair.resolved import load
    from pairctl.sentinel import pair as sentinel_pair

    recipe_file = a.recipe or str(DEFAULT_RECIPE)
    if a.env_file is not None:
        pair = load(a.env_file, recipe_file)
        ep = Endpoint.parse(pair.endpoint).with_auth(pair.api_key)
        key = sentinel_pair.key_of(pair)
        out = Path(a.out) if a.out else sentinel_pair.probe_record_path(pair)
        return ep, key, out, pair.plan_hash
    from pairctl.engine.stack import DEFAULT_STACK

    recipe = load_recipe(recipe_file)
    rev = a.revision if a.revision is not None else (recipe.model_revision or "")
    key = ProbeKey(recipe.name, a.stack or DEFAULT_STACK, rev)
    return a.url.with_auth(os.environ.get("VLLM_API_KEY") or None), key, Path(a.out), ""


def key_source(a: argparse.Namespace) -> str:
    """Where record's key comes from (it has no --api-key: the key stays off command lines)."""
    if a.env_file is not None:
        return f"VLLM_API_KEY in {a.env_file}"
    return "VLLM_API_KEY in the environment (with --url)"


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    from pairctl.pair.config import ConfigError

    a = parse_args(argv)
    try:
        probes = load_set(a.prompts)
        ep, key, out, plan_hash = target(a)
    except (ConfigError, ProbeSetError) as exc:
        log(f"record: {exc}")
        return EXIT_USAGE
    margins = Margins(a.absolute_margin, a.relative_margin)
    try:
        session = ep.session(trust_env=False)
        try:
            ident = wait_ready(session, ep, 30.0, log, key_from=key_source(a))
        except NotReady as exc:
            raise recording.RecordFailed(str(exc)) from None
        client = ProbeClient(session, ep, ident.model, probes)
        prompts = recording.take(client, a.repeats, margins, log, a.busy_wait)
        doc = recording.recorded_doc(
            client, key, prompts, margins, a.repeats, ident.simulator, plan_hash
        )
        old = out.exists()
        recording.write(out, doc)
    except recording.RecordFailed as exc:
        log(f"record FAILED (nothing written): {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("record: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    sim = " (SIMULATOR: this record says nothing about hardware)" if ident.simulator else ""
    print(
        f"probe record for {key.label()} {'replaced' if old else 'written'}: {out}{sim}: "
        f"{recording.summary(prompts)}"
    )
    return EXIT_OK
