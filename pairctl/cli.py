"""pairctl command line: the steps ``launch/dspark_launch.sh`` sequences.

Each subcommand loads and validates the env file and recipe first (exit 2 on a bad value),
so no step can act on a half-valid configuration. The operator's commands (status, logs,
watch, sync-overlays) live in ``pairctl.ops``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pairctl import EXIT_OK, EXIT_PREFLIGHT, EXIT_USAGE, ops
from pairctl import lifecycle as lc
from pairctl import preflight as pf
from pairctl.argtypes import non_negative_int, positive_float, positive_int
from pairctl.config import ConfigError, PairConfig, check_port_clash, load_env_file
from pairctl.gate import run_gate
from pairctl.overlays import shipped_files
from pairctl.plan import (
    build_rank,
    is_secret,
    render_plan,
    resolve_image,
    with_recipe_defaults,
)
from pairctl.preflight import argcheck, runner
from pairctl.recipe import Recipe, check_passthrough, load_recipe
from pairctl.status import pair as pst

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
DEFAULT_ENV = REPO / ".env"
OVERLAY_SRC = REPO / "mods" / "dsv4-flash-overlays"
LAUNCHER = REPO / "launch" / "dspark_launch.sh"


def _load(args: argparse.Namespace) -> tuple[PairConfig, Recipe, list[str]]:
    cfg = load_env_file(args.env_file)
    for k in cfg.unknown:
        shown = "" if is_secret(k) else f" ({k})"
        print(
            f"WARN: {cfg.env_file}: unknown variable{shown} ignored; see .env.example",
            file=sys.stderr,
        )
    recipe = load_recipe(args.recipe)
    raw = cfg
    cfg = with_recipe_defaults(cfg, recipe)
    check_port_clash(raw, cfg.PORT)
    passthrough = list(args.vllm_args or [])
    if passthrough and passthrough[0] == "--":
        passthrough = passthrough[1:]
    check_passthrough(passthrough)
    resolve_image(cfg, recipe)
    return cfg, recipe, passthrough


def cmd_validate(args: argparse.Namespace) -> int:
    _load(args)
    if args.json:  # up checks its --json FILE here, before the lock and any probe
        writable_file(args.json, "--json")
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


def writable_file(path: str, flag: str) -> None:
    """Fail before the work when ``path`` cannot be written, not after it."""
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file path")
    if not parent.is_dir():
        raise ConfigError(
            f"{flag} {path}: directory {parent} does not exist; create it "
            f"(mkdir -p {parent}) or give another path"
        )
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable by this user; give another path")


def cmd_preflight(args: argparse.Namespace) -> int:
    if args.catalogue_md:
        sys.stdout.write(pf.catalogue_markdown())
        return EXIT_OK
    cfg, recipe, extra = _load(args)
    if args.json:
        writable_file(args.json, "--json")
    want = shipped_files(OVERLAY_SRC)
    checked = argcheck.require_local(cfg, recipe, extra)  # else the image's parser, in gather
    checks, evidence = runner.run(
        cfg, recipe, extra, want, ops.print_check, ops.progress, local_argv=checked
    )
    sys.stdout.write(pf.summary(checks))
    if args.json:
        Path(args.json).write_text(json.dumps(pf.as_json(checks, evidence), indent=2) + "\n")
        ops.log(f"evidence written to {args.json}")
    if pf.failed(checks):
        ops.log("preflight FAILED: nothing was started or removed")
        return EXIT_PREFLIGHT
    return EXIT_OK


def cmd_healthy(args: argparse.Namespace) -> int:
    """Exit 0 when the pair is already up and healthy (up then changes nothing), else 1.

    The endpoint is asked first: when it does not answer, the pair is not healthy, and no
    ssh round trip to rank 1 is spent finding that out.
    """
    cfg, recipe, extra = _load(args)
    if not lc.probe_health(lc.endpoint(cfg)).healthy:
        return 1
    want = lc.current_plan(cfg, recipe, extra)
    st = pst.pair_status(cfg, interval_s=0, want_plan=want)
    if st.verdict != pst.HEALTHY:
        return 1
    print(
        f"pair {cfg.PAIR_ID} is already up and healthy at {st.endpoint.url} "
        f"({', '.join(st.endpoint.models)}); nothing changed."
    )
    if st.running_plan and st.running_plan != want:
        print(
            f"note: it runs plan {st.running_plan}, the current config is {want}: run down, "
            "then up, to apply the change."
        )
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    return lc.cleanup(cfg)


def cmd_start(args: argparse.Namespace) -> int:
    cfg, recipe, extra = _load(args)
    return lc.start_rank(cfg, recipe, args.rank, extra)


def cmd_wait(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    return lc.wait_healthy(cfg, args.timeout, poll_s=args.poll)


def cmd_lock_path(args: argparse.Namespace) -> int:
    """Where up/down serialise per pair (two operators must not race on one pair)."""
    cfg, _, _ = _load(args)
    print(ops.lock_path(cfg))
    return EXIT_OK


def cmd_endpoint(args: argparse.Namespace) -> int:
    cfg, _, _ = _load(args)
    print(lc.endpoint(cfg))
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    """The quality gate against this pair's endpoint (the key by env, no proxy)."""
    cfg, _, _ = _load(args)
    return run_gate(cfg)


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

    def op(fn):
        return lambda args: fn(args, *_load(args))

    sp = add("validate", cmd_validate, "validate env file and recipe")
    sp.add_argument("--json", default=None, help="also check that this file can be written")
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
    sp.add_argument("--timeout", type=positive_float, default=900.0)
    # PAIRCTL_POLL_S: tests poll fast; operators keep the 2 s default.
    sp.add_argument("--poll", type=float, default=float(os.environ.get("PAIRCTL_POLL_S", "2")))
    sp = add(
        "status",
        op(ops.status),
        "per rank state and uptime, endpoint, live serving figures; exit 0 healthy, "
        "7 degraded, 8 down",
    )
    sp.add_argument("--json", action="store_true", help="one JSON document (docs/INTERFACES.md)")
    sp.add_argument("--watch", action="store_true", help="live view, redrawn every --interval")
    sp.add_argument(
        "--interval",
        type=positive_float,
        default=None,
        help="seconds between the /metrics scrapes that rates are taken over "
        "(default 1; with --watch the refresh period, default 2)",
    )
    sp.add_argument("--count", type=positive_int, default=None, help="--watch: stop after N")
    add("endpoint", cmd_endpoint, "print the endpoint base URL")
    add("gate", cmd_gate, "run the quality gate against the endpoint")
    add("lock-path", cmd_lock_path, "print this pair's launcher lock file")
    sp = add("sync-overlays", op(ops.sync_overlays), "copy the overlays to both nodes, verified")
    sp.add_argument("--src", default=str(OVERLAY_SRC))
    sp = add("logs", op(ops.logs), "container log of one rank")
    sp.add_argument("--rank", type=int, choices=(0, 1), default=0)
    sp.add_argument("-f", "--follow", action="store_true")
    sp.add_argument("--tail", type=non_negative_int, default=None)
    sp = add("watch", op(ops.watchdog), "a token every --interval; restart after --failures")
    sp.add_argument("--launcher", default=str(LAUNCHER), help="the launcher that restarts")
    sp.add_argument("--interval", type=positive_float, default=30.0, help="seconds between probes")
    sp.add_argument(
        "--failures", type=positive_int, default=3, help="failed probes in a row before a restart"
    )
    sp.add_argument(
        "--probe-timeout", type=positive_float, default=60.0, help="seconds one probe may take"
    )
    sp.add_argument(
        "--backoff", type=positive_float, default=30.0, help="first wait after a failed restart"
    )
    sp.add_argument(
        "--backoff-max", type=positive_float, default=600.0, help="cap of the doubling backoff"
    )
    sp.add_argument("--timeout", type=positive_int, default=900, help="up's health timeout, s")
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
