"""``dspark``: the one command (``[project.scripts]``). ``dspark GROUP ...`` runs a
subcommand from ``pairctl.cli.registry`` (fleet, gate, sentinel, bench NAME, sim NAME,
perfmodel), its parser built by the owning module's ``add_cli_args``; anything else is a
pair command (``dspark [up|down|status|...] [options] [-- VLLM_ARGS...]``, ``up`` when none
is given), read by ``pairctl.cli.frontdoor`` exactly as the launcher reads it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from pairctl.cli import main as pair_main
from pairctl.cli.registry import GROUPS, Command, summary
from pairctl.contracts import EXIT_INTERRUPTED, EXIT_USAGE

PROG = "dspark"


def _description(mod: ModuleType) -> str | None:
    return (mod.__doc__ or "").strip().split("\n\n")[0] or None


def _attach(p: argparse.ArgumentParser, cmd: Command) -> ModuleType:
    """``cmd``'s flags on ``p`` (shared ones first), and its ``main`` as the one to call."""
    mod = importlib.import_module(cmd.module)
    for shared in cmd.shared:
        importlib.import_module(shared).add_cli_args(p)
    mod.add_cli_args(p)
    p.set_defaults(_main=mod.main, _parser=p)
    return mod


def _parser(prog: str, entry: Command | dict[str, Command], chosen: str) -> argparse.ArgumentParser:
    """``dspark NAME``'s parser; of a table, only the chosen command's module is imported."""
    root = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    if isinstance(entry, Command):
        mod = importlib.import_module(entry.module)
        root.description = _description(mod)
        _attach(root, entry)
        return root
    root.description = f"{prog} NAME [options]: NAME --help for each one's options"
    sub = root.add_subparsers(dest="_name", metavar="NAME", required=True)
    for n, cmd in entry.items():
        if n != chosen:
            sub.add_parser(n, help=cmd.help)
            continue
        mod = importlib.import_module(cmd.module)
        sp = sub.add_parser(
            n,
            help=cmd.help,
            description=_description(mod),
            epilog=getattr(importlib.import_module(cmd.shared[0]), "EPILOG", None)
            if cmd.shared
            else None,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        _attach(sp, cmd)
    return root


# The pyproject extra that brings a group's third-party imports (`pip install .` has none).
EXTRA = {"bench": "bench", "sim": "sim", "perfmodel": "perfmodel"}


def run_group(name: str, argv: list[str], prog: str = PROG) -> int:
    """``dspark NAME ARGS``: parse with the owning module's flags, run its ``main``; a
    missing optional dependency is exit 2 naming the extra that installs it."""
    try:
        return _run_group(name, argv, prog)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in ("pairctl", "bench", "sim", "perfmodel") or name not in EXTRA:
            raise
        print(
            f"{prog} {name}: needs {top}, which the '{EXTRA[name]}' extra installs: "
            f"pip install '.[{EXTRA[name]}]' (or make venv)",
            file=sys.stderr,
        )
        return EXIT_USAGE


def _run_group(name: str, argv: list[str], prog: str) -> int:
    entry = GROUPS[name]
    chosen = argv[0] if argv and isinstance(entry, dict) else ""
    cmd = entry.get(chosen) if isinstance(entry, dict) else entry
    if cmd is not None and cmd.argv:  # the module reads its own line
        return int(importlib.import_module(cmd.module).main(argv[1:]))
    args = _parser(f"{prog} {name}", entry, chosen).parse_args(argv)
    return int(args._main(args))


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Every command; ``prog`` is the name --help shows (the launcher passes its own)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in GROUPS:
        try:
            return run_group(argv[0], argv[1:], prog)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    return pair_main.main(argv, prog=prog, also=summary())


if __name__ == "__main__":
    sys.exit(main())
