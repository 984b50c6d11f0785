"""pairctl command line: the steps ``launch/dspark_launch.sh`` sequences.

Each subcommand loads and validates the env file and recipe first (exit 2 on a bad value),
so no step can act on a half-valid configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pairctl import EXIT_OK, EXIT_PREFLIGHT, EXIT_USAGE, argcheck
from pairctl import lifecycle as lc
from pairctl import preflight as pf
from pairctl.config import ConfigError, PairConfig, load_env_file
from pairctl.gate import run_gate
from pairctl.nodes import nodes
from pairctl.overlays import shipped_files, sync
from pairctl.plan import (
    build_rank,
    container_name,
    is_secret,
    render_plan,
    resolve_image,
    with_recipe_defaults,
)
from pairctl.probe import gather
from pairctl.recipe import Recipe, check_passthrough, load_recipe

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
DEFAULT_ENV = REPO / ".env"
OVERLAY_SRC = REPO / "mods" / "dsv4-flash-overlays"


def _load(args: argparse.Namespace) -> tuple[PairConfig, Recipe, list[str]]:
    cfg = load_env_file(args.env_file)
    for k in cfg.unknown:
        shown = "" if is_secret(k) else f" ({k})"
        print(
            f"WARN: {cfg.env_file}: unknown variable{shown} ignored; see .env.example",
            file=sys.stderr,
        )
    recipe = load_recipe(args.recipe)
    cfg = with_recipe_defaults(cfg, recipe)
    passthrough = list(args.vllm_args or [])
    if passthrough and passthrough[0] == "--":
        passthrough = passthrough[1:]
    check_passthrough(passthrough)
    resolve_image(cfg, recipe)
    return cfg, recipe, passthrough


def cmd_validate(args: argparse.Namespace) -> int:
    _load(args)
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    cfg, recipe, extra = _load(args)
    checked = argcheck.require_local(cfg, recipe, extra)  # vLLM's parser, if importable here
    sys.stdout.write(render_plan(cfg, recipe, extra, argcheck.plan_note(checked)))
    return EXIT_OK


def cmd_argv(args: argparse.Namespace) -> int:
    """One rank's docker argv, NUL-separated, unmasked (for tests and tooling only)."""
    cfg, recipe, extra = _load(args)
    rp = build_rank(cfg, recipe, args.rank, extra, overlay=not args.no_overlay)
    sys.stdout.write("\0".join(rp.docker_argv) + "\0")
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    if args.catalogue_md:
        sys.stdout.write(pf.catalogue_markdown())
        return EXIT_OK
    cfg, recipe, extra = _load(args)
    want = shipped_files(OVERLAY_SRC)
    checked = argcheck.require_local(cfg, recipe, extra)  # else the image's parser, below
    evidence = gather(cfg, recipe, extra, checked)
    checks = pf.decide(cfg, recipe, extra, evidence, want)
    sys.stdout.write(pf.render(checks))
    if args.json:
        Path(args.json).write_text(json.dumps(pf.as_json(checks, evidence), indent=2) + "\n")
        print(f"evidence written to {args.json}", file=sys.stderr)
    if pf.failed(checks):
        print("preflight FAILED: nothing was started or removed", file=sys.stderr)
        return EXIT_PREFLIGHT
    return EXIT_OK


def cmd_healthy(args: argparse.Namespace) -> int:
    """Exit 0 when the pair is already up and healthy (up then changes nothing), else 1."""
    cfg, recipe, extra = _load(args)
    state = lc.pair_state(cfg)
    if lc.is_healthy_pair(cfg, state):
        want = lc.current_plan(cfg, recipe, extra)
        rp = lc.running_plan(state)
        print(
            f"pair {cfg.PAIR_ID} is already up and healthy at {lc.endpoint(cfg)}/v1 "
            f"({', '.join(state['health']['models'])}); nothing changed."
        )
        if rp and rp != want:
            print(
                f"note: it runs plan {rp}, the current config is {want}: run down, then up, "
                "to apply the change."
            )
        return EXIT_OK
    return 1


def cmd_cleanup(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    return lc.cleanup(cfg)


def cmd_start(args: argparse.Namespace) -> int:
    cfg, recipe, extra = _load(args)
    return lc.start_rank(cfg, recipe, args.rank, extra)


def cmd_wait(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    return lc.wait_healthy(cfg, args.timeout, poll_s=args.poll)


def cmd_status(args: argparse.Namespace) -> int:
    cfg, recipe, extra = _load(args)
    state = lc.pair_state(cfg)
    sys.stdout.write(lc.render_status(cfg, state, lc.current_plan(cfg, recipe, extra)))
    return EXIT_OK


def cmd_lock_path(args: argparse.Namespace) -> int:
    """Where up/down serialise per pair (two operators must not race on one pair)."""
    cfg, _, _ = _load(args)
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    # SPARK1 in the name: two test pairs on one machine may share a PAIR_ID.
    print(f"{base}/dsv4-launch-{cfg.PAIR_ID}-{cfg.SPARK1}.lock")
    return EXIT_OK


def cmd_endpoint(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    print(lc.endpoint(cfg))
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    """The quality gate against this pair's endpoint (the key by env, no proxy)."""
    cfg, _, _ = _load(args)
    return run_gate(cfg)


def cmd_sync_overlays(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    return sync(cfg, Path(args.src))


def cmd_logs(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    node = nodes(cfg)[args.rank]
    argv = ["docker", "logs"]
    if args.tail is not None:
        argv += ["--tail", str(args.tail)]
    if args.follow:
        argv.append("-f")
    argv.append(container_name(cfg.PAIR_ID, args.rank))
    full = node.wrap(argv)
    sys.stdout.flush()
    os.execvp(full[0], full)
    return EXIT_OK  # not reached


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pairctl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--env-file", default=str(DEFAULT_ENV))
        sp.add_argument("--recipe", default=str(DEFAULT_RECIPE))
        sp.add_argument(
            "vllm_args",
            nargs=argparse.REMAINDER,
            help="after --: extra vLLM serve args (override the recipe)",
        )
        sp.set_defaults(fn=fn)
        return sp

    add("validate", cmd_validate, "validate env file and recipe")
    add("plan", cmd_plan, "print what up would run")
    sp = add("argv", cmd_argv, "one rank's docker argv, NUL-separated")
    sp.add_argument("--rank", type=int, choices=(0, 1), required=True)
    sp.add_argument("--no-overlay", action="store_true")
    sp = add("preflight", cmd_preflight, "read-only checks")
    sp.add_argument("--json", default=None, help="write verdicts + evidence to this file")
    sp.add_argument(
        "--catalogue-md",
        action="store_true",
        help="print the checks as launch/README.md's markdown table, check nothing",
    )
    add("healthy", cmd_healthy, "exit 0 if the pair is already healthy")
    add("cleanup", cmd_cleanup, "remove this pair's containers on both nodes")
    sp = add("start", cmd_start, "start one rank")
    sp.add_argument("--rank", type=int, choices=(0, 1), required=True)
    sp = add("wait", cmd_wait, "wait for health while watching both ranks")
    sp.add_argument("--timeout", type=float, default=900.0)
    # PAIRCTL_POLL_S: tests poll fast; operators keep the 2 s default.
    sp.add_argument("--poll", type=float, default=float(os.environ.get("PAIRCTL_POLL_S", "2")))
    add("status", cmd_status, "containers, health, requests")
    add("endpoint", cmd_endpoint, "print the endpoint base URL")
    add("gate", cmd_gate, "run the quality gate against the endpoint")
    add("lock-path", cmd_lock_path, "print this pair's launcher lock file")
    sp = add("sync-overlays", cmd_sync_overlays, "copy the overlays to both nodes, verified")
    sp.add_argument("--src", default=str(OVERLAY_SRC))
    sp = add("logs", cmd_logs, "container logs of one rank")
    sp.add_argument("--rank", type=int, choices=(0, 1), default=0)
    sp.add_argument("-f", "--follow", action="store_true")
    sp.add_argument("--tail", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
