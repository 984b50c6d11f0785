"""The one log helper: a progress or error line for the operator, flushed at once.

Lines go to stderr so stdout stays the command's result (a table, JSON, a plan); the
watchdog's event lines go to stdout (its output is the log journald keeps). A module that
prefixes its lines (``image: ``, ``model: ``, ``dspark_launch: ``) binds ``logger(prefix)``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO


def log(msg: str, prefix: str = "", stream: TextIO | None = None) -> None:
    """``prefix + msg`` as one line on ``stream`` (default: the current sys.stderr)."""
    print(f"{prefix}{msg}", file=sys.stderr if stream is None else stream, flush=True)


def logger(prefix: str) -> Callable[[str], None]:
    """``log`` with ``prefix`` bound: the module's own ``log(msg)``."""
    return functools.partial(log, prefix=prefix)


def stamp() -> str:
    """Now in UTC to the second, ``2026-12-02T10:13:45Z``: every log and record line's time."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
