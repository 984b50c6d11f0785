"""The pair commands' options, one table: each option's spellings, the commands it applies
to, its help and how its value is read (``pairctl.cli.frontdoor`` builds one argparse
subparser per command from it, ``pairctl.cli.usage`` the --help text). Values that fail
their check raise ``argparse.ArgumentTypeError`` with the message the user sees after the
flag's name; the defaults live in ``frontdoor.Args``.
"""

from __future__ import annotations

from argparse import ArgumentTypeError as Bad
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pairctl.cli import argtypes
from pairctl.cli.options import ENV_FILE, INTERVAL, JSON, RECIPE
from pairctl.contracts import (
    BOOT_TIMEOUT_S,
    CANARY_EVERY_S,
    IMAGE_STAGE_DIR,
    PROBE_EVERY_S,
    STATUS_INTERVAL_S,
    STATUS_REFRESH_S,
    STATUS_WATCH_MIN_S,
    WATCH_BACKOFF_MAX_S,
    WATCH_BACKOFF_S,
    WATCH_FAILURES,
    WATCH_INTERVAL_S,
    WATCH_MIN_INTERVAL_S,
    WATCH_PROBE_TIMEOUT_S,
)

COMMANDS = (
    "up",
    "down",
    "status",
    "logs",
    "plan",
    "preflight",
    "sync-overlays",
    "image",
    "model",
    "watch",
)
# Commands that take an action word right after them (``image ship``, ``model fetch``).
ACTIONS = {"image": ("ship",), "model": ("fetch", "verify")}


def _rank(text: str) -> int:
    if text not in ("0", "1", "2", "3"):
        raise Bad(f"must be 0 or 1 (0-3 in a group of four), got '{text}'")
    return int(text)


def _lines(text: str) -> int:
    if not text.isdigit():
        raise Bad(f"must be a whole number of lines (0 or more), got '{text}'")
    return int(text)


def _canary_every(text: str) -> float:
    """0 (off) or at least 60 s: the canary and the acceptance probe are meant to cost
    seconds an hour, not a load."""
    try:
        v = float(text)
    except ValueError:
        raise Bad(f"must be a number of seconds (0 = off, else >= 60), got '{text}'") from None
    if v != 0 and not 60 <= v <= argtypes.MAX_SECONDS:
        raise Bad(
            f"must be 0 (off) or at least 60 seconds (at most {argtypes.MAX_SECONDS:g}), "
            f"got '{text}'"
        )
    return v


@dataclass(frozen=True)
class Opt:
    """One option: its spellings, the commands it applies to, and how its value is read."""

    flags: tuple[str, ...]
    dest: str
    commands: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] | None = None  # None: a flag without a value
    metavar: str = ""
    hidden: bool = False


OPTIONS: tuple[Opt, ...] = (
    Opt(ENV_FILE.flags, "env_file", COMMANDS, ENV_FILE.help, str, ENV_FILE.metavar),
    Opt(RECIPE.flags, "recipe", COMMANDS, RECIPE.help, str, RECIPE.metavar),
    Opt(
        JSON.flags,
        "json",
        ("up", "preflight", "status"),
        "preflight/up: write the preflight evidence as JSON to FILE; status: print one JSON "
        "document instead (with --watch: one per line)",
        None,
        "[FILE]",
    ),
    Opt(
        ("--timeout",),
        "timeout",
        ("up", "watch"),
        f"backstop on the whole health wait in seconds (default {BOOT_TIMEOUT_S}); each boot "
        "phase has its own limit, longer on a first boot (~10 min), and a stalled phase ends "
        "the boot first. A whole number >= 1",
        argtypes.whole_seconds,
        "S",
    ),
    Opt(("--gate",), "gate", ("up",), "run the quality gate against the endpoint when healthy"),
    Opt(
        ("--src",),
        "src",
        ("sync-overlays",),
        "overlay package to copy (default mods/dsv4-flash-overlays); must exist",
        str,
        "DIR",
    ),
    Opt(("--rank",), "rank", ("logs",), "which rank (default 0)", _rank, "0-3"),
    Opt(("-f", "--follow"), "follow", ("logs",), "follow"),
    Opt(("--tail",), "tail", ("logs",), "last N lines", _lines, "N"),
    Opt(("--watch",), "watch", ("status",), "live view, redrawn every --interval seconds"),
    Opt(
        INTERVAL.flags,
        "interval",
        ("status", "watch"),
        f"status: seconds the rates are measured over (default {STATUS_INTERVAL_S:g}; --watch: "
        f"refresh, default {STATUS_REFRESH_S:g}, at least {STATUS_WATCH_MIN_S:g}); watch: "
        f"seconds between probes (default {WATCH_INTERVAL_S:g}, at least {WATCH_MIN_INTERVAL_S:g})",
        argtypes.seconds(0),
        "S",
    ),
    Opt(
        ("--count",),
        "count",
        ("status",),
        "--watch: stop after N",
        argtypes.positive_int,
        "N",
        hidden=True,
    ),
    Opt(
        ("--failures",),
        "failures",
        ("watch",),
        f"failed probes in a row before a restart (default {WATCH_FAILURES})",
        argtypes.positive_int,
        "K",
    ),
    Opt(
        ("--probe-timeout",),
        "probe_timeout",
        ("watch",),
        f"seconds one probe may take (default {WATCH_PROBE_TIMEOUT_S:g})",
        argtypes.seconds(0),
        "S",
    ),
    Opt(
        ("--backoff",),
        "backoff",
        ("watch",),
        f"wait after a failed restart, doubling up to --backoff-max (default {WATCH_BACKOFF_S:g})",
        argtypes.seconds(0),
        "S",
    ),
    Opt(
        ("--backoff-max",),
        "backoff_max",
        ("watch",),
        f"cap of the doubling backoff (default {WATCH_BACKOFF_MAX_S:g})",
        argtypes.seconds(0),
        "S",
    ),
    Opt(
        ("--build",),
        "build",
        ("image",),
        "ship: first docker build the stack's Dockerfile on rank 0 (fork: "
        "launch/image/Dockerfile), tagged IMAGE",
    ),
    Opt(
        ("--pull",),
        "pull",
        ("image",),
        "ship: first docker pull IMAGE on rank 0 (a registry reference, best by digest)",
    ),
    Opt(
        ("--stage",),
        "stage",
        ("image",),
        "ship: where the image tar waits on both nodes while it is copied: an absolute path, "
        f"the same on both (default {IMAGE_STAGE_DIR}; needs the image's size free); checked "
        "writable here before anything runs",
        argtypes.work_dir,
        "DIR",
    ),
    Opt(
        ("--checksum",),
        "checksum",
        ("model",),
        "fetch/verify: also compare the sha256 of every file on both nodes (minutes per 100 GB)",
    ),
    Opt(
        ("--skip-download",),
        "skip_download",
        ("model",),
        "fetch: MODEL_PATH on rank 0 is complete already; only copy it to rank 1 and verify",
    ),
    Opt(
        ("--downloader",),
        "downloader",
        ("model",),
        "fetch: the Hugging Face CLI to run (default: hf beside the launcher's Python, else "
        "on PATH); it gets `download REPO --revision COMMIT --local-dir MODEL_PATH`",
        str,
        "CMD",
    ),
    Opt(
        ("--canary-every",),
        "canary_every",
        ("watch",),
        f"seconds between runs of the output canary (5 greedy short answers; default "
        f"{CANARY_EVERY_S}; 0 = off). A bad answer is an event, never a restart",
        _canary_every,
        "S",
    ),
    Opt(
        ("--probe-every",),
        "probe_every",
        ("watch",),
        f"seconds between rounds of the acceptance probe (3 fixed greedy prompts, each judged "
        f"against its own record, asked while the pair is idle; default {PROBE_EVERY_S}; 0 = "
        "off). A fault is an event, never a restart",
        _canary_every,
        "S",
    ),
    Opt(
        ("--catalogue-md",),
        "catalogue_md",
        ("preflight",),
        "print the checks as launch/README.md's table, check nothing",
        hidden=True,
    ),
)
BY_FLAG = {f: o for o in OPTIONS for f in o.flags}
BY_DEST = {o.dest: o for o in OPTIONS}
PASSTHROUGH_COMMANDS = ("up", "plan", "preflight", "status", "watch")
