"""Preflight: read-only checks with stable IDs, PASS/WARN/FAIL/SKIP and a remedy each.

Every decision is a pure function of recorded evidence (``pairctl.preflight.evidence``, gathered by
``pairctl.preflight.probe``) plus the config, so the verdicts are unit-tested without nodes. ``up``
runs this first and stops on any FAIL before a single container is started or removed
(exit 3). Layout: ``check`` (what a check is), ``checks_*`` (the checks, by concern),
``registry`` (all of them in report order, and the README table), ``runner`` (runs them
as their evidence arrives), ``report`` (terminal and JSON output).
"""

from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need
from pairctl.preflight.registry import BY_ID, CHECKS, catalogue_markdown, decide
from pairctl.preflight.report import as_json, failed, render, render_check, summary

__all__ = [
    "BY_ID",
    "CHECKS",
    "FAIL",
    "PASS",
    "SKIP",
    "WARN",
    "Check",
    "CheckSpec",
    "Need",
    "as_json",
    "catalogue_markdown",
    "decide",
    "failed",
    "render",
    "render_check",
    "summary",
]
