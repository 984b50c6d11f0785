"""The operator's command line, parsed once: ``dspark [COMMAND] [options] [-- VLLM_ARGS...]``
(``launch/dspark_launch.sh`` and ``python -m pairctl`` take the same line).

The syntax is the seed launcher's: the command may stand anywhere (``up`` when none is
given), ``--json`` is a flag for ``status`` and takes a FILE for ``up``/``preflight``, and
anything after ``--`` goes to ``vllm serve`` on both ranks. The parsing is argparse's: one
subparser per command, built by ``add_cli_args`` from the option table
(``pairctl.cli.pairopts``). An option given to a command it does not belong to is a usage
error naming the commands it applies to, never silently ignored; every usage error is one
line naming the flag, exit 2.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import NoReturn

from pairctl.cli import argtypes
from pairctl.cli.pairopts import (
    ACTIONS,
    BY_FLAG,
    COMMANDS,
    OPTIONS,
    PASSTHROUGH_COMMANDS,
    Opt,
)
from pairctl.cli.usage import usage
from pairctl.contracts import (
    ACCEPTANCE_WINDOW_S,
    BOOT_TIMEOUT_S,
    CANARY_EVERY_S,
    DEFAULT_ENV,
    DEFAULT_RECIPE,
    IMAGE_STAGE_DIR,
    OVERLAY_SRC,
    STATUS_WATCH_MIN_S,
    WATCH_BACKOFF_MAX_S,
    WATCH_BACKOFF_S,
    WATCH_FAILURES,
    WATCH_MIN_INTERVAL_S,
    WATCH_PROBE_TIMEOUT_S,
)

__all__ = ["COMMANDS", "OPTIONS", "Args", "UsageError", "add_cli_args", "parse", "usage"]


class UsageError(Exception):
    """A bad command line: exit 2 with this message (one line, names the fix)."""


@dataclass
class Args:
    """The parsed command line: the defaults of every option, whichever command it is for
    (a restart from ``watch`` runs ``up`` with the same Args)."""

    cmd: str = "up"
    env_file: str = str(DEFAULT_ENV)
    recipe: str = str(DEFAULT_RECIPE)
    json: bool = False
    json_file: str | None = None
    timeout: int = BOOT_TIMEOUT_S
    gate: bool = False
    src: str = str(OVERLAY_SRC)
    rank: int = 0
    follow: bool = False
    tail: int | None = None
    watch: bool = False
    interval: float | None = None
    count: int | None = None
    failures: int = WATCH_FAILURES
    probe_timeout: float = WATCH_PROBE_TIMEOUT_S
    backoff: float = WATCH_BACKOFF_S
    backoff_max: float = WATCH_BACKOFF_MAX_S
    canary_every: float = float(CANARY_EVERY_S)
    acceptance_window: float = float(ACCEPTANCE_WINDOW_S)
    catalogue_md: bool = False
    action: str = ""
    build: bool = False
    pull: bool = False
    stage: str = IMAGE_STAGE_DIR
    checksum: bool = False
    skip_download: bool = False
    downloader: str | None = None
    vllm_args: list[str] = field(default_factory=list)
    help: bool = False


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one UsageError line in the launcher's words."""

    def error(self, message: str) -> NoReturn:
        m = re.match(r"argument (\S+): (.*)", message)
        if not m:
            raise UsageError(f"{message} (see --help)")
        flag, why = m.group(1).split("/")[-1], m.group(2)
        if why == "expected one argument":
            raise UsageError(f"{flag} needs a value (see --help)")
        if why.startswith("ignored explicit argument"):
            raise UsageError(f"{flag} takes no value (see --help)")
        raise UsageError(f"{flag} {why}")


def _add(p: argparse.ArgumentParser, o: Opt) -> None:
    kw: dict = {"dest": o.dest, "default": argparse.SUPPRESS}
    kw["help"] = argparse.SUPPRESS if o.hidden else o.help
    if o.dest == "json":
        kw.update(nargs="?", const=True, metavar="FILE")
    elif o.parse is None:
        kw["action"] = "store_true"
    else:
        kw.update(type=o.parse, metavar=o.metavar)
    p.add_argument(*o.flags, **kw)


def add_cli_args(parser: argparse.ArgumentParser, cmd: str) -> argparse.ArgumentParser:
    """The options of pair command ``cmd`` onto ``parser`` (absent ones stay unset, so
    ``Args`` gives their defaults)."""
    for o in OPTIONS:
        if cmd in o.commands:
            _add(parser, o)
    return parser


def _subparser(cmd: str) -> argparse.ArgumentParser:
    p = _Parser(prog=cmd, add_help=False, allow_abbrev=False)
    return add_cli_args(p, cmd)


def _find_command(argv: list[str]) -> int | None:
    """Where the command word stands (None: ``up``); skips the values options take. A
    ``--help`` ends the scan (raised as _Help), unless an unknown word stands before it."""
    at: int | None = None
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in COMMANDS:
            if at is not None:
                raise UsageError(
                    f"two commands given ('{argv[at]}' and '{tok}'); pick one (see --help)"
                )
            at = i
            i += 1 if tok in ACTIONS and argv[i + 1 : i + 2] not in (["-h"], ["--help"]) else 0
        elif tok in ("-h", "--help"):
            raise _Help
        elif tok.partition("=")[0] not in BY_FLAG:
            raise UsageError(f"unknown argument '{tok}' (see --help)")
        elif "=" not in tok:
            o = BY_FLAG[tok]
            nxt = argv[i + 1] if i + 1 < len(argv) else "-"
            if o.dest == "json":
                i += 0 if nxt.startswith("-") or nxt in COMMANDS else 1
            elif o.parse is not None:
                i += 1
        i += 1
    return at


class _Help(Exception):
    """--help was asked for (before anything unknown)."""


def _take_action(cmd: str, word: str) -> str:
    """The action word after ``image``/``model``; a missing or unknown one is a usage error."""
    allowed = ACTIONS[cmd]
    if word not in allowed:
        got = f"'{word}'" if word else "nothing"
        raise UsageError(
            f"{cmd} needs one of: {', '.join(allowed)} (got {got}); e.g. {cmd} {allowed[0]}"
        )
    return word


def parse(argv: list[str]) -> Args:
    """The launcher's command line into ``Args``; raises UsageError saying what to fix."""
    argv = list(argv)
    extra: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    try:
        at = _find_command(argv)
    except _Help:
        return Args(help=True)
    cmd, action, rest = "up", "", argv
    if at is not None:
        cmd, rest = argv[at], argv[:at] + argv[at + 1 :]
        if cmd in ACTIONS:
            action = _take_action(cmd, rest[at] if at < len(rest) else "")
            del rest[at]
    ns, unknown = _subparser(cmd).parse_known_args(rest)
    if unknown:
        flag = unknown[0].partition("=")[0] if unknown[0].startswith("--") else unknown[0]
        if flag not in BY_FLAG:
            raise UsageError(f"unknown argument '{unknown[0]}' (see --help)")
        _not_for(cmd, flag, BY_FLAG[flag].commands)
    if extra is not None and cmd not in PASSTHROUGH_COMMANDS:
        _not_for(cmd, "extra vLLM args after --", PASSTHROUGH_COMMANDS)
    values = vars(ns)
    json_value = values.pop("json", None)
    a = Args(cmd=cmd, action=action, vllm_args=extra or [], **values)
    a.json = json_value is True
    a.json_file = json_value if isinstance(json_value, str) else None
    _check(a, "src" in values)
    return a


def _not_for(cmd: str, shown: str, where: tuple[str, ...]) -> NoReturn:
    raise UsageError(f"{shown} does not apply to {cmd} (only to: {', '.join(where)}); see --help")


def _check(a: Args, src_given: bool) -> None:
    """The rules between options (one command's flags that exclude each other)."""
    if a.build and a.pull:
        raise UsageError("image ship takes --build or --pull, not both (see --help)")
    if a.cmd == "model" and a.action == "verify" and (a.skip_download or a.downloader):
        raise UsageError("--skip-download and --downloader apply to model fetch only")
    if a.cmd == "status" and a.json_file is not None:
        raise UsageError(
            f"status --json prints JSON on stdout and takes no FILE (got '{a.json_file}'); "
            "redirect it: status --json > FILE"
        )
    if a.cmd != "status" and a.json:
        raise UsageError(f"--json needs a FILE for {a.cmd} (see --help)")
    floor = {"status": STATUS_WATCH_MIN_S if a.watch else 0, "watch": WATCH_MIN_INTERVAL_S}
    if a.interval is not None and a.interval < floor.get(a.cmd, 0):
        what = "status --watch refreshes" if a.cmd == "status" else "watch probes"
        raise UsageError(
            f"--interval must be at least {floor[a.cmd]:g} s: {what} every --interval "
            f"seconds (got {a.interval:g}; see --help)"
        )
    if src_given:  # checked here, after "applies", and before any probe
        try:
            argtypes.existing_dir(a.src)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--src {exc}") from None
