"""The sentinel's and canary's lines in ``status`` (text and live view) from ``PairStatus``
data only."""

from __future__ import annotations

from typing import Any

WHY_NONE = {
    "insufficient": "not judged",
    "no-baseline": "not judged",
    "no-spec": "not judged",
    "mismatch": "not judged",
    "error": "not judged",
}


def acceptance_line(acc: dict[str, Any] | None) -> str | None:
    """One line: the state, the depth ratio against the floor, or why it was not judged."""
    if not acc:
        return None
    state = acc.get("state", "?")
    if state == "ok":
        line = f"acceptance sentinel: in band ({acc['detail']}) [{acc['window']}]"
        return line + (f"; note: {acc['note']}" if acc.get("note") else "")
    if state == "drop":
        return f"acceptance sentinel: DROP: {acc['detail']} [{acc.get('window')}]"
    hint = ""
    if state == "no-baseline":
        hint = " (record one: python -m pairctl.sentinel record --env-file FILE)"
    return f"acceptance sentinel: {WHY_NONE.get(state, state)}: {acc.get('detail')}{hint}"


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
