"""The operator's command line, parsed once: ``launch/dspark_launch.sh [COMMAND] [options]
[-- VLLM_ARGS...]`` (the launcher only execs ``python -m pairctl`` with its arguments).

The syntax is the seed launcher's: the command may stand anywhere (``up`` when none is
given), ``--json`` is a flag for ``status`` and takes a FILE for ``up``/``preflight``, and
anything after ``--`` goes to ``vllm serve`` on both ranks. Each option belongs to the
commands listed in ``OPTIONS``; giving it to another command is a usage error naming the
commands it applies to, never silently ignored. The usage text is generated from the same
table and from ``pairctl.contracts``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pairctl.cli import argtypes
from pairctl.contracts import (
    ACCEPTANCE_WINDOW_S,
    BOOT_TIMEOUT_S,
    CANARY_EVERY_S,
    DEFAULT_ENV,
    DEFAULT_RECIPE,
    DEFAULT_RECIPE_REL,
    OVERLAY_SRC,
    PAIR_EXITS,
    exit_text,
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
PASSTHROUGH = "--"  # the key under which the extra vLLM args are checked


class UsageError(Exception):
    """A bad command line: exit 2 with this message (one line, names the fix)."""


def _whole_seconds(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"must be a whole number of seconds (at least 1), got '{text}'")
    if int(text) < 1:
        raise ValueError(f"must be at least 1 second, got '{text}'")
    return int(text)


def _rank(text: str) -> int:
    if text not in ("0", "1"):
        raise ValueError(f"must be 0 or 1, got '{text}'")
    return int(text)


def _lines(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"must be a whole number of lines (0 or more), got '{text}'")
    return int(text)


def _canary_every(text: str) -> float:
    """0 (off) or at least 60 s: the canary is meant to cost seconds an hour, not a load."""
    try:
        v = float(text)
    except ValueError:
        raise ValueError(
            f"must be a number of seconds (0 = off, else >= 60), got '{text}'"
        ) from None
    if v != 0 and not 60 <= v < float("inf"):
        raise ValueError(f"must be 0 (off) or at least 60 seconds, got '{text}'")
    return v


def _argtype(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """pairctl.cli.argtypes' messages, as a ValueError this parser reports with the flag."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    return parse


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
    Opt(("--env-file",), "env_file", COMMANDS, "pair config (default: REPO/.env)", str, "FILE"),
    Opt(
        ("--recipe",),
        "recipe",
        COMMANDS,
        f"serving recipe (default: {DEFAULT_RECIPE_REL})",
        str,
        "FILE",
    ),
    Opt(
        ("--json",),
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
        _whole_seconds,
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
    Opt(("--rank",), "rank", ("logs",), "which rank (default 0)", _rank, "0|1"),
    Opt(("-f", "--follow"), "follow", ("logs",), "follow"),
    Opt(("--tail",), "tail", ("logs",), "last N lines", _lines, "N"),
    Opt(("--watch",), "watch", ("status",), "live view, redrawn every --interval seconds"),
    Opt(
        ("--interval",),
        "interval",
        ("status", "watch"),
        "status: seconds the rates are measured over (default 1; --watch: refresh, default "
        "2); watch: seconds between probes (default 30)",
        _argtype(argtypes.positive_float),
        "S",
    ),
    Opt(
        ("--count",),
        "count",
        ("status",),
        "--watch: stop after N",
        _argtype(argtypes.positive_int),
        "N",
        hidden=True,
    ),
    Opt(
        ("--failures",),
        "failures",
        ("watch",),
        "failed probes in a row before a restart (default 3)",
        _argtype(argtypes.positive_int),
        "K",
    ),
    Opt(
        ("--probe-timeout",),
        "probe_timeout",
        ("watch",),
        "seconds one probe may take (default 60)",
        _argtype(argtypes.positive_float),
        "S",
    ),
    Opt(
        ("--backoff",),
        "backoff",
        ("watch",),
        "wait after a failed restart, doubling up to --backoff-max (default 30)",
        _argtype(argtypes.positive_float),
        "S",
    ),
    Opt(
        ("--backoff-max",),
        "backoff_max",
        ("watch",),
        "cap of the doubling backoff (default 600)",
        _argtype(argtypes.positive_float),
        "S",
    ),
    Opt(
        ("--build",),
        "build",
        ("image",),
        "ship: first docker build launch/image/Dockerfile on rank 0, tagged IMAGE",
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
        "ship: where the image tar waits on both nodes while it is copied (default "
        "/var/tmp/dsv4-image; needs the image's size free)",
        str,
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
        ("--acceptance-window",),
        "acceptance_window",
        ("watch",),
        f"seconds of spec-decode counters the acceptance sentinel judges (default "
        f"{ACCEPTANCE_WINDOW_S}; "
        "longer while fewer drafts than the baseline's minimum). A drop is an event, never "
        "a restart",
        _argtype(argtypes.positive_float),
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
PASSTHROUGH_COMMANDS = ("up", "plan", "preflight", "status", "watch")


@dataclass
class Args:
    """The parsed command line (defaults applied; ``given`` = the options the user typed)."""

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
    failures: int = 3
    probe_timeout: float = 60.0
    backoff: float = 30.0
    backoff_max: float = 600.0
    canary_every: float = float(CANARY_EVERY_S)
    acceptance_window: float = float(ACCEPTANCE_WINDOW_S)
    catalogue_md: bool = False
    action: str = ""
    build: bool = False
    pull: bool = False
    stage: str = "/var/tmp/dsv4-image"
    checksum: bool = False
    skip_download: bool = False
    downloader: str | None = None
    vllm_args: list[str] = field(default_factory=list)
    help: bool = False
    given: dict[str, str] = field(default_factory=dict)


def parse(argv: list[str]) -> Args:
    """The launcher's command line into ``Args``; raises UsageError saying what to fix."""
    a = Args()
    seen_cmd = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in COMMANDS:
            if seen_cmd:
                raise UsageError(
                    f"two commands given ('{a.cmd}' and '{tok}'); pick one (see --help)"
                )
            a.cmd, seen_cmd = tok, True
            if tok in ACTIONS:
                i = _take_action(a, argv, i)
        elif tok in ("-h", "--help"):
            a.help = True
            return a
        elif tok == "--":
            a.vllm_args = list(argv[i + 1 :])
            a.given[PASSTHROUGH] = "extra vLLM args after --"
            break
        else:
            flag, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
            opt = BY_FLAG.get(flag)
            if opt is None:
                raise UsageError(f"unknown argument '{tok}' (see --help)")
            a.given[opt.dest] = flag
            if opt.dest == "json":
                i = _take_json(a, argv, i, inline if eq else None)
            elif opt.parse is None:
                if eq:
                    raise UsageError(f"{flag} takes no value (see --help)")
                setattr(a, opt.dest, True)
            else:
                if eq:
                    value = inline
                elif i + 1 < len(argv):
                    i += 1
                    value = argv[i]
                else:
                    raise UsageError(f"{flag} needs a value (see --help)")
                try:
                    setattr(a, opt.dest, opt.parse(value))
                except ValueError as exc:
                    raise UsageError(f"{flag} {exc}") from None
        i += 1
    _check_applies(a)
    return a


def _take_action(a: Args, argv: list[str], i: int) -> int:
    """The action word after ``image``/``model``; a missing or unknown one is a usage error."""
    allowed = ACTIONS[a.cmd]
    word = argv[i + 1] if i + 1 < len(argv) else ""
    if word in ("-h", "--help"):
        return i  # `image --help` is the help, as for every command
    if word not in allowed:
        got = f"'{word}'" if word else "nothing"
        raise UsageError(
            f"{a.cmd} needs one of: {', '.join(allowed)} (got {got}); e.g. {a.cmd} {allowed[0]}"
        )
    a.action = word
    return i + 1


def _take_json(a: Args, argv: list[str], i: int, inline: str | None) -> int:
    """``--json`` is a flag (status) or takes a FILE (up, preflight): a next word that is
    neither an option nor a command is its FILE."""
    if inline is not None:
        a.json_file = inline
    elif i + 1 < len(argv) and not argv[i + 1].startswith("-") and argv[i + 1] not in COMMANDS:
        a.json_file = argv[i + 1]
        return i + 1
    else:
        a.json = True
    return i


def _check_applies(a: Args) -> None:
    for dest, shown in a.given.items():
        where = PASSTHROUGH_COMMANDS if dest == PASSTHROUGH else BY_DEST[dest].commands
        if a.cmd not in where:
            raise UsageError(
                f"{shown} does not apply to {a.cmd} (only to: {', '.join(where)}); see --help"
            )
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
    if "src" in a.given:  # checked here, after "applies", and before any probe
        try:
            argtypes.existing_dir(a.src)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--src {exc}") from None


BY_DEST = {o.dest: o for o in OPTIONS}

COMMAND_HELP = {
    "up": "(default) preflight; remove this pair's stale containers on both nodes; start "
    "rank 1 over ssh (--node-rank 1 --headless), then rank 0; wait for /health and "
    "/v1/models showing elapsed time and boot phase; if a rank dies, tear both down and "
    "print its log tail. On an already healthy pair: says so, changes nothing.",
    "down": "stop and remove this pair's containers (label dsv4.pair=PAIR_ID) on both nodes.",
    "status": "each rank's container state and uptime, endpoint health and model, and live "
    "serving figures from /metrics: running/waiting, decode tok/s, TTFT p50/p95, KV-cache "
    "use, prefix-cache hit rate, DSpark acceptance per draft position and mean acceptance "
    "length, shown only once rank 0's labelled container runs on SPARK1 (else: whose endpoint it "
    "may be). --json for machines, --watch for a live view. Exit 0 healthy, 7 degraded, 8 "
    "down, 9 the endpoint rejects VLLM_API_KEY.",
    "logs": "container log of one rank (--rank 0|1, -f to follow, --tail N).",
    "plan": "print the exact docker run lines per rank (env, mounts, vLLM args; secrets "
    "masked). Changes nothing.",
    "preflight": "read-only checks with stable IDs (PASS/WARN/FAIL + remedy); --json FILE "
    "writes the evidence. up runs it first and stops on any FAIL.",
    "sync-overlays": "copy the files that ship in mods/dsv4-flash-overlays/ to OVERLAY_DIR on "
    "both nodes, check every file's sha256 on arrival, then swap the copy in (a node that "
    "fails keeps its old copy; exit 1). Refuses (exit 3) unless this machine is SPARK1 and "
    "SPARK2 is another one (PF-SELF-IS-SPARK1, PF-DISTINCT-NODES).",
    "image": "IMAGE on both ranks with the same image ID: on rank 0 build it "
    "(--build: launch/image/Dockerfile), pull it (--pull) or use the one there; then docker "
    "save, a resumable copy to rank 1 over ssh (bytes/s shown), docker load there, and the "
    "image ID compared on both. Skips rank 1 when it has the same ID already; touches no "
    "image but IMAGE. Refuses (exit 3) off SPARK1, as sync-overlays does.",
    "model": "fetch: download MODEL_REPO at MODEL_REVISION into MODEL_PATH on rank 0 "
    "(hf download; resumes), copy it to rank 1 over ssh (resumable, bytes/s), then verify. "
    "verify: compare both copies only (file list, sizes, every shard "
    "model.safetensors.index.json names; --checksum: sha256 too). HF_TOKEN goes to the "
    "downloader's environment only. Refuses (exit 3) off SPARK1.",
    "watch": "watchdog: a 1-token completion every --interval s; after --failures failed "
    "probes in a row, down then up (backoff after a failed up); a 401/403 (wrong key) stops "
    "it with exit 9 and never restarts the pair. Runs until stopped (SIGTERM/Ctrl-C); one "
    "timestamped line per event. After each good probe: the acceptance sentinel (acceptance "
    "per draft position against the recipe's recorded band) and, every --canary-every s, the "
    "output canary; both log events and never restart. launch/dsv4-watch@.service runs it "
    "under systemd.",
}


def usage() -> str:
    """--help: commands, options (with the commands each applies to) and exit codes."""
    import textwrap

    def block(head: str, text: str) -> str:
        body = textwrap.fill(text, 88, initial_indent=" " * 20, subsequent_indent=" " * 20)
        return (f"  {head:<17} " + body[20:]) if len(head) < 18 else f"  {head}\n{body}"

    out = [
        "Usage: launch/dspark_launch.sh ["
        + "|".join(c for c in COMMANDS if c not in ACTIONS)
        + "]",
        "                               [options] [-- VLLM_ARGS...]",
        "       launch/dspark_launch.sh image ship [--build|--pull] [--stage DIR] [options]",
        "       launch/dspark_launch.sh model fetch|verify [--checksum] [options]",
        "       launch/dspark_launch.sh fleet plan|up|down|status|prometheus [options]"
        "   (--help there)",
        "",
        "Run on the rank-0 Spark (SPARK1). One OpenAI endpoint at http://SPARK1:PORT/v1.",
        "",
        "Commands:",
    ]
    out += [
        block(" ".join([c, "|".join(ACTIONS.get(c, ()))]).strip(), COMMAND_HELP[c])
        for c in COMMANDS
    ]
    out += ["", "Options:"]
    for o in OPTIONS:
        if o.hidden:
            continue
        head = ", ".join(o.flags) + (f" {o.metavar}" if o.metavar else "")
        out.append(
            block(head, f"{', '.join(o.commands) if o.commands != COMMANDS else 'all'}: {o.help}")
        )
    out.append(block("-h, --help", "this help"))
    out.append(block("-- ARGS", "extra vllm serve args for both ranks (override the recipe)"))
    out += ["", "Exit codes:", exit_text(PAIR_EXITS)]
    return "\n".join(out)
