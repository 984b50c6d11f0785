"""The acceptance probe's and canary's lines in ``status`` (text and live view) from
``PairStatus`` data only."""

from __future__ import annotations

from typing import Any


def acceptance_line(acc: dict[str, Any] | None) -> str | None:
    """One line: the probe's last round as watch recorded it, or why there is none."""
    if not acc:
        return None
    state = acc.get("state", "?")
    detail = acc.get("detail")
    if state in ("ok", "fault", "error", "busy"):
        age = acc.get("age_s")
        ago = f"recorded by watch {age:.0f} s ago, " if isinstance(age, int | float) else ""
        label = {"ok": "at its record", "fault": "FAULT", "error": "ERROR", "busy": "not judged"}
        return f"acceptance probe ({ago}round {acc.get('at')}): {label[state]}: {detail}"
    return f"acceptance probe: {state}: {detail}"


def canary_line(record: dict[str, Any] | None) -> str | None:
    """The last canary run watch recorded, if any."""
    canary = (record or {}).get("canary")
    if not canary:
        return None
    verdicts = canary.get("verdicts", [])
    right = sum(v.get("kind") == "ok" for v in verdicts)
    bad = [f"{v['kind']} {v['name']}" for v in verdicts if v.get("kind") != "ok"]
    tail = f"; {', '.join(bad)}" if bad else ""
    return (
        f"output canary (recorded by watch, run {canary.get('at')}): "
        f"{right}/{len(verdicts)} right{tail}"
    )


def lines(
    acc: dict[str, Any] | None, record: dict[str, Any] | None, events: list[str]
) -> list[str]:
    out = [x for x in (acceptance_line(acc), canary_line(record)) if x]
    return out + [f"EVENT {e}" for e in events]
