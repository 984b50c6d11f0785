"""The quality gate's command line (``python -m pairctl.gate``, ``python -m
bench.quality_ref_dspark``): flags checked before any request, then ``run_gate``.

Example: python -m pairctl.gate --url http://HOST:8000
"""

from __future__ import annotations

import argparse

from pairctl.cli import argtypes
from pairctl.contracts import (
    GATE_EXITS,
    GATE_PROMPT_TIMEOUT_S,
    GATE_READY_TIMEOUT_S,
    codes,
    exit_line,
)
from pairctl.endpoint import add_endpoint_args, endpoint_of
from pairctl.gate import GateOptions, run_gate
from pairctl.gate.check import DEFAULT_PROMPTS, load_reference
from pairctl.log import log

EXIT_INTERRUPTED = codes(GATE_EXITS)["EXIT_INTERRUPTED"]

DESCRIPTION = (
    "Quality gate: 5 greedy prompts with exact-answer checks; exit non-zero on any failure."
)
EPILOG = exit_line(GATE_EXITS)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    add_endpoint_args(
        p,
        ("http", "https"),
        "send X-Session-ID: ID with every request (a router with session affinity then "
        "sends the whole gate to one pair)",
    )
    p.add_argument(
        "--prompts",
        type=load_reference,
        default=str(DEFAULT_PROMPTS),
        help="reference prompts JSON",
    )
    p.add_argument(
        "--timeout-s",
        type=argtypes.seconds(0),
        default=GATE_PROMPT_TIMEOUT_S,
        help="per-prompt timeout",
    )
    p.add_argument(
        "--ready-timeout-s",
        type=argtypes.seconds(0),
        default=GATE_READY_TIMEOUT_S,
        help="wait this long for /v1/models (progress on stderr)",
    )
    p.add_argument(
        "--max-tokens",
        type=argtypes.int_at_least(1),
        default=None,
        help="override the file's max_tokens",
    )
    p.add_argument("--thinking", action="store_true", help="render in thinking mode")
    p.add_argument(
        "--json",
        dest="json_path",
        type=argtypes.output_file,
        default=None,
        help="write verdicts JSON here (its directory must exist)",
    )


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=EPILOG,
    )
    add_cli_args(p)
    return p.parse_args(argv)


def main(
    argv: argparse.Namespace | list[str] | None = None, prog: str = "python -m pairctl.gate"
) -> int:
    """Parse the flags (exit 2 on a bad one) and run the gate; its exit code. ``argv``: the
    command line, or the Namespace ``dspark gate`` parsed already with ``add_cli_args``."""
    args = argv if isinstance(argv, argparse.Namespace) else parse_args(argv, prog)
    options = GateOptions(
        prompts=args.prompts,
        model=args.model,
        timeout_s=args.timeout_s,
        ready_timeout_s=args.ready_timeout_s,
        max_tokens=args.max_tokens,
        thinking=args.thinking,
        json_path=args.json_path,
    )
    # The environment's proxy settings hold, as for any client a user runs by hand.
    try:
        return run_gate(endpoint_of(args), options, trust_env=True)
    except KeyboardInterrupt:  # Ctrl-C while waiting for the endpoint or a prompt
        log("gate: interrupted")
        return EXIT_INTERRUPTED
