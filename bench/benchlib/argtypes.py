"""argparse types for the bench flags: a bad value is a usage error (exit 2) naming the flag.

Every check that does not need the server happens here, before any work: numbers in range,
sizes like "4k", lists like "1,2,4", and output files whose directory must exist and be
writable (a run of minutes must not end with its JSON lost to a typo in the path).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SUFFIX = {"k": 1024, "m": 1024 * 1024}


def _number(kind: type, text: str, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {noun} ({what}), got {text!r}") from None


def int_at_least(low: int) -> Callable[[str], int]:
    """A whole number >= low."""

    def parse(text: str) -> int:
        v = _number(int, text, f">= {low}")
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    parse.__name__ = f"int >= {low}"
    return parse


def float_above(low: float, inclusive: bool = False) -> Callable[[str], float]:
    """A number > low (>= low when inclusive)."""
    sign = ">=" if inclusive else ">"

    def parse(text: str) -> float:
        v = _number(float, text, f"{sign} {low:g}")
        if v != v or v < low or (v == low and not inclusive):  # v != v: NaN
            raise argparse.ArgumentTypeError(f"must be {sign} {low:g}, got {text}")
        return v

    parse.__name__ = f"number {sign} {low:g}"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
positive_float = float_above(0.0)
nonneg_float = float_above(0.0, inclusive=True)


def parse_size(text: str) -> int:
    """'1k' -> 1024, '128k' -> 131072, '1m' -> 1048576, '500' -> 500 (tokens, >= 1)."""
    s = text.strip().lower()
    mult = _SUFFIX.get(s[-1:], 1)
    try:
        v = int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a token count like 500, 4k or 1m, got {text!r}"
        ) from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 token, got {text!r}")
    return v


def size(text: str) -> int:
    return parse_size(text)


size.__name__ = "token count"


def size_list(text: str) -> list[int]:
    """'1k,4k,16k' -> [1024, 4096, 16384]; at least one."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one token count, e.g. 1k,4k")
    return [parse_size(t) for t in items]


def int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; positive whole numbers, at least one."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one whole number, e.g. 1,2,4")
    out = []
    for t in items:
        try:
            v = int(t)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"needs comma-separated whole numbers >= 1 (e.g. 1,2,4), got {t!r}"
            ) from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"needs whole numbers >= 1, got {v}")
        out.append(v)
    return out


def json_object(text: str) -> dict[str, Any]:
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"thinking\": false}}' ({e})"
        ) from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return v


def output_file(text: str) -> str:
    """A file we can write later: its directory exists and is writable; it is not a directory."""
    p = Path(text).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"directory {parent} does not exist (create it first: mkdir -p {parent})"
        )
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return str(p)


output_file.__name__ = "output file"


def png_file(text: str) -> str:
    """An output file for a plot; matplotlib must be importable (checked now, not at the end)."""
    path = output_file(text)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise argparse.ArgumentTypeError(
            "needs matplotlib, which is not installed (pip install matplotlib)"
        ) from None
    return path


png_file.__name__ = "plot file"
