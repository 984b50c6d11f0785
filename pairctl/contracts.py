"""The contracts other pieces rely on, each defined once: exit codes and their meanings,
default paths and timeouts.

The launcher's ``--help``, the watchdog's and the fleet's log lines, and the exit-code
tables in launch/README.md and docs/INTERFACES.md are all generated from here
(``python -m pairctl contracts``); tests/test_contracts.py fails when a table in a doc
differs from what this module renders.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ENV = REPO / ".env"
DEFAULT_RECIPE_REL = "recipes/dsv4-flash-dspark.yaml"
DEFAULT_RECIPE = REPO / DEFAULT_RECIPE_REL
OVERLAY_SRC = REPO / "mods" / "dsv4-flash-overlays"
DEFAULT_INVENTORY = REPO / "pairs" / "fleet.yaml"

# How long `up` waits for /health before it tears both ranks down (exit 5). The seed puts a
# first boot at ~10 min (graph capture); 900 s leaves room for it. A later boot reuses the
# mounted JIT caches and is faster.
BOOT_TIMEOUT_S = 900
# The boot-phase poll of `up` (docker inspect + log tail per rank, then /health).
BOOT_POLL_S = 2.0


@dataclass(frozen=True)
class ExitCode:
    """One exit code: its number, a constant name, and what it means (one table row)."""

    code: int
    name: str
    meaning: str
    short: str  # the few words a log line uses (watch, fleet summary)


PAIR_EXITS: tuple[ExitCode, ...] = (
    ExitCode(
        0,
        "EXIT_OK",
        "success (also: `up` on an already healthy pair, which changes nothing)",
        "ok",
    ),
    ExitCode(
        1,
        "EXIT_RUNTIME",
        "other runtime error (e.g. `down` could not reach a node; `logs` could not reach the "
        "rank's node, or it has no container of this pair)",
        "runtime error",
    ),
    ExitCode(
        2,
        "EXIT_USAGE",
        "usage or configuration error (bad flag, an option the command does not take, "
        "missing/malformed `.env` value, `MASTER_PORT` equal to the endpoint port, bad "
        "recipe, an unwritable `--json FILE`)",
        "usage or configuration error",
    ),
    ExitCode(
        3,
        "EXIT_PREFLIGHT",
        "preflight FAIL, or another `up`/`down` of this pair holds its lock (nothing was "
        "started or removed); `sync-overlays` run anywhere but `SPARK1` (nothing copied)",
        "preflight FAIL or the pair's lock is held",
    ),
    ExitCode(
        4,
        "EXIT_BOOT",
        "boot failure: a rank died (or a start failed) during `up` (both torn down, dead "
        "rank's log tail printed)",
        "boot failure (both ranks torn down)",
    ),
    ExitCode(
        5,
        "EXIT_TIMEOUT",
        "timeout waiting for health (both torn down, both log tails printed)",
        "health timeout (both ranks torn down)",
    ),
    ExitCode(
        6,
        "EXIT_GATE",
        "the post-`up` quality gate (`--gate`) failed (endpoint left running)",
        "quality gate failed",
    ),
    ExitCode(
        7,
        "EXIT_DEGRADED",
        "`status`: degraded (something runs, not all of it healthy)",
        "degraded",
    ),
    ExitCode(
        8,
        "EXIT_DOWN",
        "`status`: down (the endpoint does not answer and no rank's container is known to run)",
        "down",
    ),
    ExitCode(
        9,
        "EXIT_KEY",
        "API key problem: the endpoint answered 401/403 to `VLLM_API_KEY` (wrong, or unset "
        "while the server requires one). `status` says so; `watch` stops without restarting "
        "the pair (a restart cannot fix a key): fix `VLLM_API_KEY` in the env file",
        "API key rejected (fix VLLM_API_KEY)",
    ),
    ExitCode(
        130,
        "EXIT_INTERRUPTED",
        "interrupted (Ctrl-C, SIGTERM, SIGHUP); a boot in progress was torn down first",
        "interrupted",
    ),
)

FLEET_EXITS: tuple[ExitCode, ...] = (
    ExitCode(0, "EXIT_OK", "ok (also: `up` on a whole fleet, which changes nothing)", "ok"),
    ExitCode(1, "EXIT_ERROR", "runtime error (`down` could not reach a machine)", "error"),
    ExitCode(2, "EXIT_USAGE", "usage or inventory error", "usage or inventory error"),
    ExitCode(
        3,
        "EXIT_PREFLIGHT",
        "router host or image not ready, or another fleet up/down holds the lock (nothing "
        "started or removed)",
        "router host/image not ready or fleet lock held",
    ),
    ExitCode(
        4,
        "EXIT_PAIRS",
        "some pair(s) did not come up (the rest and the router did; the summary names them)",
        "some pair(s) did not come up",
    ),
    ExitCode(5, "EXIT_ROUTER", "the router did not become ready", "router not ready"),
    ExitCode(
        7,
        "EXIT_DEGRADED",
        "`status`: degraded (the router or some pair not healthy, but something serves)",
        "degraded",
    ),
    ExitCode(
        8,
        "EXIT_DOWN",
        "`status`: down (the router is not ready and no pair is healthy)",
        "down",
    ),
)

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_BOOT = 4
EXIT_TIMEOUT = 5
EXIT_GATE = 6
EXIT_DEGRADED = 7
EXIT_DOWN = 8
EXIT_KEY = 9
EXIT_INTERRUPTED = 130


def meaning(code: int, table: tuple[ExitCode, ...] = PAIR_EXITS) -> str:
    """The short meaning of a pair launcher's exit code, for a log line."""
    for e in table:
        if e.code == code:
            return e.short
    return "unexpected exit"


def exit_table_md(table: tuple[ExitCode, ...]) -> str:
    """The Markdown table the docs carry (a test compares them)."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {e.code} | {e.meaning} |" for e in table]
    return "\n".join(rows) + "\n"


def exit_text(table: tuple[ExitCode, ...], width: int = 88) -> str:
    """The exit codes as --help prints them: one wrapped paragraph per code."""
    out = []
    for e in table:
        text = e.meaning.replace("`", "")
        out.append(
            textwrap.fill(text, width, initial_indent=f"  {e.code:<4}", subsequent_indent="      ")
        )
    return "\n".join(out) + "\n"


def _check_constants() -> None:
    """The constants above are the tables' numbers (a typo in either fails at import)."""
    names = {e.name: e.code for e in PAIR_EXITS}
    for name, code in names.items():
        assert globals()[name] == code, name


_check_constants()


def main(argv: list[str]) -> int:
    """``python -m pairctl contracts [pair|fleet]``: print an exit-code table for the docs."""
    which = argv[0] if argv else "pair"
    tables = {"pair": PAIR_EXITS, "fleet": FLEET_EXITS}
    if which not in tables or len(argv) > 1:
        print("usage: python -m pairctl contracts [pair|fleet]", file=sys.stderr)
        return EXIT_USAGE
    print(exit_table_md(tables[which]), end="")
    return EXIT_OK
