"""Classes of log lines, so a simulator's log and a real vLLM log can be compared.

Two logs of the same kind of event never match line by line: pids, times, numbers and
paths differ, and the simulator imitates vLLM 0.33 while the CPU engine is 0.32, whose
line numbers differ. A line's class is what stays: the process name vLLM gives it
(``APIServer``, ``EngineCore``, ``Worker_TP1``, ``uvicorn`` for uvicorn's lines), the
level, the source file's base name, and the message's first words with numbers, paths and
quoted values masked. Lines that are not logger lines (tracebacks, raw prints) keep their
first words under the process name ``-``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

VLLM_LINE = re.compile(
    r"^\((?P<proc>[A-Za-z_0-9\-]+) pid=\d+\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<file>[^\]:]+)(?::\d+)?\] ?(?P<msg>.*)$"
)
UVICORN_LINE = re.compile(r"^(?P<level>INFO|WARNING|ERROR|CRITICAL|DEBUG):\s+(?P<msg>.*)$")
_MASKS = [
    (re.compile(r"'[^']*'|\"[^\"]*\""), "Q"),
    (re.compile(r"\{.*\}"), "{...}"),
    (re.compile(r"\[.*\]"), "[...]"),
    (re.compile(r"\b(?:tcp|http|file)://\S+"), "URL"),
    (re.compile(r"(?:/[\w.\-]+)+/?"), "PATH"),
    (re.compile(r"\d+(?:[.,:]\d+)*"), "N"),
]
WORDS = 6
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def mask(msg: str, words: int = WORDS) -> str:
    """The message with values masked, cut to its first ``words`` words."""
    out = msg
    for pat, repl in _MASKS:
        out = pat.sub(repl, out)
    return " ".join(out.split()[:words])


def classify(line: str) -> str | None:
    """``proc|LEVEL|file|masked message`` for one log line; None for a blank line."""
    line = ANSI.sub("", line.rstrip("\n"))
    if not line.strip():
        return None
    m = VLLM_LINE.match(line)
    if m:
        proc = m["proc"]
        return f"{proc}|{m['level']}|{m['file']}|{mask(m['msg'])}"
    m = UVICORN_LINE.match(line)
    if m:
        return f"uvicorn|{m['level']}|-|{mask(m['msg'])}"
    return f"-|-|-|{mask(line.strip(), 4)}"


def classes(lines: Iterable[str]) -> list[str]:
    """Each class once, in first-seen order."""
    seen: dict[str, None] = {}
    for line in lines:
        cls = classify(line)
        if cls is not None:
            seen.setdefault(cls, None)
    return list(seen)


def key(cls: str) -> str:
    """What must match between the two logs: process, level, file and message (the file
    is dropped for unprefixed lines)."""
    return cls
