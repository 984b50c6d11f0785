"""One exit-code table's row type and the ways it is printed (docs, --help, log lines).

Every command family's table (pairctl.contracts and pairctl.contracts.commands) is a tuple of
``ExitCode``; the docs' tables, the --help epilogs and the log lines are rendered from it
here, so a code's number and meaning are written once.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    """One exit code: its number, a constant name, and what it means (one table row)."""

    code: int
    name: str
    meaning: str
    short: str  # the few words a log line or a one-line epilog uses


def meaning(code: int, table: tuple[ExitCode, ...]) -> str:
    """The short meaning of ``code`` in ``table``, for a log line."""
    for e in table:
        if e.code == code:
            return e.short
    return "unexpected exit"


def codes(table: tuple[ExitCode, ...]) -> dict[str, int]:
    """The table as constant name -> number (a command module binds its EXIT_* from it)."""
    return {e.name: e.code for e in table}


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


def exit_line(table: tuple[ExitCode, ...]) -> str:
    """The exit codes as a one-line --help epilog: ``Exit codes: 0 ok; 1 ...; 2 usage.``"""
    return "Exit codes: " + "; ".join(f"{e.code} {e.short}" for e in table) + "."
