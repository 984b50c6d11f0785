"""`launch/dspark_launch.sh fleet plan|up|down|status|prometheus|alert-floors` (python -m
pairctl.fleet).

A fleet is several pairs behind one vLLM router with conversation affinity (X-Session-ID).
Every pair is still brought up and down by its own `pairctl up|down` on its own head (the
command its launcher execs; never the bash launcher itself); the fleet runs
those side by side and manages the router container (label dsv4.fleet=<fleet_id>).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pairctl.cli import argtypes
from pairctl.contracts import BOOT_TIMEOUT_S, FLEET_EXITS, exit_text
from pairctl.fleet import (
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_USAGE,
    alertfloors,
    monitoring,
    ops,
    render,
)
from pairctl.fleet.inventory import DEFAULT_INVENTORY, load_inventory
from pairctl.lock import LockHeld
from pairctl.pair.config import ConfigError

EPILOG = (
    "exit codes:\n"
    + exit_text(FLEET_EXITS)
    + "docs/fleet.md has the details (python -m pairctl contracts fleet prints the table)."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launch/dspark_launch.sh fleet",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cli_args(p)
    return p


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """The fleet's commands (plan, up, down, status, prometheus, alert-floors) and their
    flags onto ``p``."""
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--inventory",
        default=str(DEFAULT_INVENTORY),
        help="fleet inventory (default: pairs/fleet.yaml; see pairs/fleet.yaml.example)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, parents=[common], description=help_)

    add("plan", "what up would run where; changes nothing, contacts nothing")
    sp = add(
        "up",
        "bring up every pair that is not healthy (in parallel, each with its own "
        "launcher), then the router; wait until the router counts them healthy",
    )
    sp.add_argument(
        "--timeout",
        type=argtypes.whole_seconds,
        default=BOOT_TIMEOUT_S,
        help=f"each pair's up --timeout, the backstop on its health wait (default "
        f"{BOOT_TIMEOUT_S}; each boot phase has its own limit, longer on a first boot)",
    )
    sp = add("down", "remove the fleet's router container, then run each pair's down")
    sp.add_argument(
        "--router-only", action="store_true", help="remove only the router; pairs keep serving"
    )
    sp = add("status", "each pair's health and the router's view of it")
    sp.add_argument("--json", action="store_true", help="machine-readable status on stdout")
    sp = add("prometheus", "print a Prometheus scrape config for the router and every pair")
    sp.add_argument(
        "--output",
        type=argtypes.output_file,
        default=None,
        help="write it to this file instead of stdout (its directory must exist)",
    )
    floors_help = (
        "print the Prometheus rule file of the acceptance alerts' floors (load it beside "
        "monitoring/prometheus/dsv4-alerts.yml), from healthy acceptance classes: the "
        "published figures, or a recorded probe's (--classes)"
    )
    sp = sub.add_parser("alert-floors", help=floors_help, description=floors_help)
    sp.add_argument(
        "--classes",
        default=None,
        help="a JSON or YAML file {source, classes: [{name, per_pos, spread}]}: per draft "
        "position, the share of drafts accepted there and its repeat spread (default: the "
        "published classes in pairctl/fleet/alertfloors.py)",
    )
    sp.add_argument(
        "--output",
        type=argtypes.output_file,
        default=None,
        help=f"write it to this file instead of stdout (the repo's copy: "
        f"{alertfloors.DEFAULT_OUTPUT})",
    )


def floors_cmd(args: argparse.Namespace) -> int:
    """``fleet alert-floors``: no inventory needed; a bad classes file is a usage error."""
    try:
        if args.classes:
            classes, source = alertfloors.load_classes(args.classes)
        else:
            classes, source = alertfloors.ANCHOR, alertfloors.ANCHOR_SOURCE
        text = alertfloors.render(classes, source)
    except alertfloors.FloorsError as exc:
        print(f"fleet alert-floors: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        Path(args.output).write_text(text)
        print(f"acceptance floors written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    """``argv``: the command line, or the Namespace ``dspark fleet`` parsed already."""
    args = argv if isinstance(argv, argparse.Namespace) else build_parser().parse_args(argv)
    if args.cmd == "up" and args.timeout < 1:
        print("fleet: --timeout must be at least 1 second", file=sys.stderr)
        return EXIT_USAGE
    if args.cmd == "alert-floors":
        return floors_cmd(args)
    try:
        fleet = load_inventory(args.inventory)
    except ConfigError as exc:
        print(f"fleet: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = ops.Out()
    try:
        if args.cmd == "plan":
            sys.stdout.write(render.plan(fleet))
            return EXIT_OK
        if args.cmd == "prometheus":
            text = monitoring.render(fleet)
            if args.output:
                Path(args.output).write_text(text)
                print(f"scrape config written to {args.output}", file=sys.stderr)
            else:
                sys.stdout.write(text)
            return EXIT_OK
        if args.cmd == "status":
            st = ops.status(fleet)
            if args.json:
                print(json.dumps(st.to_json(fleet), indent=1))
            else:
                sys.stdout.write(render.status_text(fleet, st))
            return st.exit_code
        with ops.fleet_lock(fleet.fleet_id):
            if args.cmd == "up":
                res = ops.up(fleet, args.timeout, out)
                sys.stdout.write(render.up_summary(fleet, res))  # "" when up refused at once
                return res.code
            dres = ops.down(fleet, args.router_only, out)
            sys.stdout.write(render.down_summary(fleet, dres))
            return dres.code
    except LockHeld as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return EXIT_PREFLIGHT
    except KeyboardInterrupt:
        print("fleet: interrupted (see the lines above for each pair)", file=sys.stderr)
        return 130
