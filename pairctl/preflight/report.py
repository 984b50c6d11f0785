"""Preflight's two outputs: the terminal report (streamed, one check at a time) and the
``--json`` document."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check
from pairctl.preflight.evidence import Evidence

SCHEMA_VERSION = 1


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def render_check(c: Check) -> str:
    """One verdict: the status line, then the remedy when there is something to fix."""
    lines = [f"{c.status:4}  {c.id:22} {c.detail}"]
    if c.remedy:
        lines.append(f"      {'':22} fix: {c.remedy}")
    return "\n".join(lines) + "\n"


def summary(checks: list[Check]) -> str:
    n = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL, SKIP)}
    return f"preflight: {n[PASS]} pass, {n[WARN]} warn, {n[FAIL]} fail, {n[SKIP]} skip\n"


def render(checks: list[Check]) -> str:
    return "".join(render_check(c) for c in checks) + summary(checks)


def as_json(checks: list[Check], evidence: Evidence) -> dict[str, Any]:
    """``{"schema_version": 1, "ok", "checks": [...], "evidence": {...}}`` (secrets masked)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "ok": not failed(checks),
        "checks": [asdict(c) for c in checks],
        "evidence": asdict(evidence),
    }
