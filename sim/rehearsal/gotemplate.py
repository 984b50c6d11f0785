"""The small part of Go's text/template that `docker --format` strings use.

The launcher formats docker output with `{{json .}}`, `{{.Id}}` or `{{.State.Running}}`;
rendering those the way the real CLI does (Go booleans are `true`, JSON is compact) keeps
the rehearsal honest about what the launcher parses.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


class TemplateError(ValueError):
    """A template the subset cannot render; the message mimics Go's."""


def _lookup(obj: Any, path: str) -> Any:
    if path == ".":
        return obj
    cur = obj
    for part in path.strip(".").split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise TemplateError(
                f'template: :1: executing "" at <{path}>: can\'t evaluate field {part}'
            )
    return cur


def _go_str(value: Any) -> str:
    """Render a value the way Go's fmt does for the types docker exposes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<no value>"
    if isinstance(value, dict):
        inner = " ".join(f"{k}:{_go_str(v)}" for k, v in sorted(value.items()))
        return f"map[{inner}]"
    if isinstance(value, list):
        return "[" + " ".join(_go_str(v) for v in value) + "]"
    return str(value)


def render(template: str, obj: Any) -> str:
    """Render `template` against `obj`; supports `.A.B`, `json .A`, and literal text."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        words = expr.split()
        if len(words) == 2 and words[0] == "json":
            return json.dumps(_lookup(obj, words[1]), separators=(",", ":"))
        if len(words) == 1 and words[0].startswith("."):
            return _go_str(_lookup(obj, words[0]))
        raise TemplateError(f"template: rehearsal runtime cannot render {{{{{expr}}}}}")

    text = template.replace("\\t", "\t").replace("\\n", "\n")
    return _ACTION.sub(one, text)
