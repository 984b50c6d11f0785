"""argparse types that reject nonsense with a message saying what is allowed.

The one home of the repository's flag types (pairctl, perfmodel, the benches, the twin). A
value argparse accepts but the code cannot use (0 seconds, -3 failures, "nan", a port of
99999, an output path in a directory that does not exist) would otherwise surface later as
a traceback, a silently wrong loop, or a result lost after minutes of work; these turn it
into a usage error (exit 2) naming the flag's rule and the value given.

Two wordings live side by side, each pinned by its callers' tests: ``positive_float``,
``positive_int`` and ``non_negative_int`` name the kind and the bound ("must be a whole
number >= 1, got '0'"; pairctl, perfmodel); ``int_at_least`` and ``float_above`` name the
bound and say the kind only when the text is not a number ("must be >= 1, got 0"; benches).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SUFFIX = {"k": 1024, "m": 1024 * 1024}


# ---- "must be a whole number >= 1, got '0'" ----------------------------------------------
def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (line counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port a server can bind: 1-65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {text!r}")
    return value


# ---- "must be >= 1, got 0" ----------------------------------------------------------------
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
        if not math.isfinite(v) or v < low or (v == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {sign} {low:g}, got {text}")
        return v

    parse.__name__ = f"number {sign} {low:g}"
    return parse


# ---- durations and ports: every wait, window and port flag of the repository ----------------
# The longest wait any flag may ask for: a week. Longer is never meant (a typo, or a way of
# saying "forever"), and time.sleep/socket timeouts overflow on numbers like 1e300.
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(
    low: float = 0.0, *, inclusive: bool = False, high: float = MAX_SECONDS, off: bool = False
) -> Callable[[str], float]:
    """A finite number of seconds, > low (>= low when inclusive) and <= high; ``off``: 0
    as well (the flag's "off"). 'inf', 'nan' and 1e309 are refused: a wait without end is
    never a value, it is a command that never returns."""
    sign = ">=" if inclusive else ">"
    rule = f"{sign} {low:g} and <= {high:g} seconds" + (" (or 0: off)" if off else "")
    if high == MAX_SECONDS:
        rule = rule.replace(f"<= {high:g} seconds", f"<= {high:g} seconds (a week)")

    def parse(text: str) -> float:
        v = _number(float, text, rule)
        if off and v == 0:
            return v
        if not math.isfinite(v) or v < low or (v == low and not inclusive) or v > high:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return v

    parse.__name__ = "seconds"
    return parse


def whole_seconds(text: str) -> int:
    """A whole number of seconds, 1 to a week (a deadline handed to another command)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"must be a whole number of seconds (at least 1), got '{text}'"
        )
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got '{text}'")
    if int(text) > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SECONDS:g} seconds (a week), got '{text}'"
        )
    return int(text)


def port_list(count: int) -> Callable[[str], list[int]]:
    """``count`` different TCP ports, comma-separated ('8101,8102'), each 1-65535."""

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        out = [port(t) for t in items]
        if len(out) != count or len(set(out)) != count:
            n = {2: "two", 3: "three"}.get(count, str(count))
            raise argparse.ArgumentTypeError(
                f"needs {n} different ports 1-65535, comma-separated, got {text!r}"
            )
        return out

    parse.__name__ = f"{count} ports"
    return parse


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


def int_list_at_most(high: int) -> Callable[[str], list[int]]:
    """``int_list`` with an upper bound per value (where a large one can hurt the machine)."""

    def parse(text: str) -> list[int]:
        out = int_list(text)
        over = [v for v in out if v > high]
        if over:
            raise argparse.ArgumentTypeError(f"needs whole numbers <= {high}, got {over[0]}")
        return out

    parse.__name__ = f"list of int <= {high}"
    return parse


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


# ---- JSON values ----------------------------------------------------------------------------
def json_object(text: str) -> dict[str, Any]:
    """A JSON object such as chat_template_kwargs."""
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"thinking\": false}}' ({e})"
        ) from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return v


def speculative_config(text: str) -> dict[str, Any]:
    """vLLM's --speculative-config: a JSON object (its own wording names the flag)."""
    try:
        val = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"--speculative-config must be JSON, e.g. "
            f'\'{{"method":"dspark","num_speculative_tokens":5}}\' ({exc})'
        ) from exc
    if not isinstance(val, dict):
        raise argparse.ArgumentTypeError("--speculative-config must be a JSON object")
    return val


# ---- output files ---------------------------------------------------------------------------
def unwritable(text: str) -> str | None:
    """Why ``text`` cannot be written as a file later (None when it can).

    Asked of the file system itself, not of permission bits alone: as root ``os.access``
    says yes to /proc or a read-only mount, and the results would be lost after the run. A
    file that does not exist yet is created and removed again, so nothing is left behind.
    """
    p = Path(text).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        return f"{text} is a directory; give a file name"
    if not parent.is_dir():
        return f"directory {parent} does not exist (create it first: mkdir -p {parent})"
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        return f"{text} is not writable ({exc.strerror or exc})"
    if not existed:
        try:
            p.unlink()
        except OSError:
            pass
    return None


def output_file(text: str) -> str:
    """A file we can write later: its directory exists and a file can be written there."""
    why = unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return str(Path(text).expanduser())


output_file.__name__ = "output file"


def output_file_or_stdout(text: str) -> str:
    """``output_file``, or ``-`` for stdout."""
    return text if text == "-" else output_file(text)


output_file_or_stdout.__name__ = "output file or -"


# What the plots are written as (matplotlib's savefig picks the format from the suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def png_file(text: str) -> str:
    """An output file for a plot; matplotlib must be importable (checked now, not at the end)."""
    path = output_file(text)
    if Path(text).suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"must end in {', '.join(PLOT_SUFFIXES)} (the plot's format), got {text!r}"
        )
    # Looked up, not imported: only a bench that plots needs it (the [bench] extra).
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(
            "needs matplotlib, which is not installed (pip install matplotlib)"
        )
    return path


png_file.__name__ = "plot file"


def not_an_option(text: str) -> str:
    """A value that is not the next option swallowed (``--stage --pull``): refused."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"needs a value, not an option ({text!r}); give it as --flag VALUE (see --help)"
        )
    return text


def dir_unwritable(text: str) -> str | None:
    """Why ``text`` cannot be (made) a directory to write into here (None when it can).

    The first part of the path that exists must be a directory the file system lets us
    create a file in, asked by creating one and removing it (as ``unwritable``: root's
    permission bits say yes to /proc). Nothing is created that stays."""
    p = Path(text).expanduser()
    have = p
    while not have.exists() and have != have.parent:
        have = have.parent
    if not have.is_dir():
        return (
            f"{text} is a file, not a directory"
            if have == p
            else f"{text}: {have} is a file, not a directory"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".dsv4-write-probe-", dir=have)
    except OSError as exc:
        return (
            f"{text}: cannot write under {have} ({exc.strerror or exc}); give a directory on a disk"
        )
    os.close(fd)
    os.unlink(probe)
    return None


def work_dir(text: str) -> str:
    """An absolute directory for large files on this node and at the same path on the other
    one (a relative path would mean two places): not empty, not an option, and writable
    here (``dir_unwritable``); it need not exist yet."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give an absolute directory path")
    not_an_option(text)
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"must be an absolute path (the same directory on both nodes), got {text!r}"
        )
    if "\n" in text:
        raise argparse.ArgumentTypeError("is not a single path")
    why = dir_unwritable(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


work_dir.__name__ = "directory"


def existing_dir(text: str) -> str:
    """A directory that is there now (a source to copy from)."""
    p = Path(text).expanduser()
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; give an existing directory")
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return str(p)


existing_dir.__name__ = "directory"
