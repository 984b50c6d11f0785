"""Tolerant answer matching, declared per prompt in the prompts file.

A greedy prompt gets the same reply every time, so an exact match that rejects a harmless
rendering of the right answer (``**Paris**``, ``Paris.``, ``paris``) is a false alarm that
never clears. Each prompt may declare what to forgive and what to accept:

- ``forgive``: a list of ``emphasis`` (markdown ``**``/``__``/``*``/``_``, inline-code
  backticks and a code fence around the reply or its words), ``punctuation`` (punctuation
  and symbols around the reply: ``Paris.``, ``"Paris"``, ``巴黎。``, a ``- `` bullet; a
  sign before a number stays), ``case`` (``PARIS``), applied to the reply and to each
  accepted answer alike;
- ``accept``: more answers that count as right (any of them, beside ``answer``);
- ``regex``: a pattern the normalised reply must match in full (``re.fullmatch``).

Whitespace around the reply is always forgiven; a prompt with none of these keys is judged
as before (``pairctl.gate.check.normalise``).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

FORGIVE = ("emphasis", "punctuation", "case")
KEYS = ("forgive", "accept", "regex")
# a span wrapped in one marker (not inside a word: snake_case stays as it is)
_EMPHASIS = re.compile(r"(?<![\w*_`])(\*\*|__|\*|_|`)(?=\S)(.+?)(?<=\S)\1(?![\w*_`])", re.DOTALL)
SIGNS = "+-\u2212"  # a sign before a number is part of the answer; a list bullet ("- ") is not


def declared(spec: dict[str, Any]) -> bool:
    """Does this prompt declare tolerant matching?"""
    return any(k in spec for k in KEYS)


def problems(spec: dict[str, Any]) -> list[str]:
    """What is wrong with a prompt's matching keys (empty: nothing)."""
    out = []
    forgive = spec.get("forgive", [])
    if not isinstance(forgive, list) or any(f not in FORGIVE for f in forgive):
        out.append(f"forgive must be a list of {', '.join(FORGIVE)}, got {forgive!r}")
    accept = spec.get("accept", [])
    if not isinstance(accept, list) or not all(isinstance(a, str) and a.strip() for a in accept):
        out.append(f"accept must be a list of non-empty strings, got {accept!r}")
    if "regex" in spec:
        try:
            re.compile(str(spec["regex"]))
        except re.error as exc:
            out.append(f"regex {spec['regex']!r} does not compile: {exc}")
        if not isinstance(spec["regex"], str):
            out.append("regex must be a string")
    return out


_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)\n?```", re.DOTALL)


def _strip_emphasis(text: str) -> str:
    """Markdown emphasis and code spans (inline or fenced) unwrapped, nested ones too."""
    prev = None
    while prev != text:
        prev = text
        fence = _FENCE.fullmatch(text)
        text = (fence.group(1) if fence else _EMPHASIS.sub(r"\2", text)).strip()
    return text


def _strip_punctuation(text: str) -> str:
    """Punctuation and symbols (Unicode P* and S*) at either end; a sign only as a bullet."""
    lo, hi = 0, len(text)
    while lo < hi and unicodedata.category(text[lo])[0] in "PS":
        if text[lo] in SIGNS and not text[lo + 1 : lo + 2].isspace():
            break
        lo += 1
    while hi > lo and unicodedata.category(text[hi - 1])[0] in "PS":
        hi -= 1
    return text[lo:hi].strip()


def normalise(text: str, forgive: list[str]) -> str:
    """``text`` with what the prompt forgives taken away."""
    t = unicodedata.normalize("NFC", text).strip()
    if "emphasis" in forgive:
        t = _strip_emphasis(t)
    if "punctuation" in forgive:
        t = _strip_punctuation(t)
        if "emphasis" in forgive:  # "**Paris**." and ".**Paris**"
            t = _strip_punctuation(_strip_emphasis(t))
    if "case" in forgive:
        t = t.casefold()
    return t


def matches(spec: dict[str, Any], reply: str) -> bool:
    """Is ``reply`` one of the prompt's right answers, after what it forgives?"""
    forgive = list(spec.get("forgive", []))
    got = normalise(reply, forgive)
    wanted = [spec["answer"], *spec.get("accept", [])]
    if any(got == normalise(w, forgive) for w in wanted):
        return True
    pattern = spec.get("regex")
    return pattern is not None and re.fullmatch(pattern, got) is not None


def expected(spec: dict[str, Any]) -> str:
    """The right answers, for a message."""
    wanted = [spec["answer"], *spec.get("accept", [])]
    out = " or ".join(repr(w) for w in wanted)
    if spec.get("regex"):
        out += f" or /{spec['regex']}/"
    if spec.get("forgive"):
        out += f" (forgiving {', '.join(spec['forgive'])})"
    return out
