"""Quality gate: 5 greedy prompts with exact-answer checks; exit non-zero on any failure.

Covers arithmetic, a fact, code output, counting and strict JSON (prompts and answers live in
pairctl/gate/quality_ref_dspark.json). Requests are non-streamed, temperature 0, fixed
max_tokens, thinking off (DSV4's chat mode) so the answer is the whole reply. A timeout, a
non-200, a malformed response body and a wrong answer each fail the prompt, and the failure
names it. Run it after any change; the launcher runs it as its post-`up` gate (launcher exit
6 on failure).

The gate itself lives in pairctl.gate (operations run it in-process; pairctl imports nothing
of bench); this is its command line under the name the benches and the docs use, with the
same flags, output and exit codes as ``python -m pairctl.gate``.

Exit codes: 0 all prompts passed; 1 at least one failed (or the endpoint is unreachable);
2 usage error; 130 interrupted (Ctrl-C).

Example: python -m bench.quality_ref_dspark --url http://HOST:8000
"""

from __future__ import annotations

import argparse

from bench.benchlib.cli import entry
from pairctl.gate import cli
from pairctl.gate.check import DEFAULT_PROMPTS, check, normalise

__all__ = ["DEFAULT_PROMPTS", "add_cli_args", "check", "main", "normalise"]

add_cli_args = cli.add_cli_args  # the gate's flags, defined there once


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    return cli.main(argv, prog="python -m bench.quality_ref_dspark")


if __name__ == "__main__":
    entry(main)
