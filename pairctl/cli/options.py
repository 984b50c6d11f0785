"""Options that several commands share, each defined once, and the one convention every
``dspark`` subcommand module follows.

A module that is a command has ``add_cli_args(parser)`` (its flags, onto a parser it is
given) and ``main(args)``, where ``args`` is either the Namespace ``dspark`` parsed with that
parser or an argv list (``python -m MODULE``): ``namespace`` turns the second into the first,
so both entry points read the same flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pairctl.contracts import DEFAULT_RECIPE_REL


@dataclass(frozen=True)
class Spec:
    """One shared option: its spelling, what it holds, and the help every command shows."""

    flags: tuple[str, ...]
    metavar: str
    help: str


ENV_FILE = Spec(("--env-file",), "FILE", "pair config (default: REPO/.env)")
RECIPE = Spec(("--recipe",), "FILE", f"serving recipe (default: {DEFAULT_RECIPE_REL})")
# `--json FILE` writes a document; a bare `--json` prints one (which one: the command's help).
JSON = Spec(("--json",), "[FILE]", "write (FILE) or print (no FILE) the result as JSON")
INTERVAL = Spec(("--interval",), "S", "seconds between readings")


def add(p: argparse.ArgumentParser | argparse._ArgumentGroup, spec: Spec, **kw: Any) -> None:
    """``spec`` on ``p``; ``kw`` (default, type, dest, a command's own help) as argparse's."""
    kw.setdefault("help", spec.help)
    if kw.get("nargs") != 0 and "action" not in kw:
        kw.setdefault("metavar", spec.metavar.strip("[]"))
    p.add_argument(*spec.flags, **kw)


def add_pair_files(p: argparse.ArgumentParser, env_help: str = "", recipe_help: str = "") -> None:
    """--env-file and --recipe, default None (the caller applies contracts' defaults)."""
    add(p, ENV_FILE, default=None, help=env_help or ENV_FILE.help)
    add(p, RECIPE, default=None, help=recipe_help or RECIPE.help)


AddArgs = Callable[[argparse.ArgumentParser], None]


def namespace(
    args: argparse.Namespace | Sequence[str] | None,
    add_cli_args: AddArgs,
    **parser_kw: Any,
) -> tuple[argparse.Namespace, argparse.ArgumentParser | None]:
    """``args`` as a Namespace: as given when ``dspark`` parsed it already, else parsed
    here with a parser built by ``add_cli_args`` (exit 2 on a bad flag). The parser comes
    back too (None for a given Namespace), for checks that report through ``error``."""
    if isinstance(args, argparse.Namespace):
        return args, getattr(args, "_parser", None)
    p = argparse.ArgumentParser(**parser_kw)
    add_cli_args(p)
    return p.parse_args(None if args is None else list(args)), p


def usage_error(p: argparse.ArgumentParser | None, message: str) -> None:
    """Exit 2 with ``message`` as argparse does (``p`` None: ``prog: error:`` unnamed)."""
    (p or argparse.ArgumentParser(prog="dspark")).error(message)
