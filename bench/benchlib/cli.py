"""The flags every bench script shares, and where progress messages go.

Scripts follow vLLM's benchmarks (vllm/benchmarks/serve.py): `add_cli_args(parser)` adds the
flags, a run function measures, a summarise function turns points into a dataclass, and `main`
only wires them together. These are the flags of every script; each adds its own after them.
`--url` becomes a pairctl Endpoint here, once; everything downstream takes that object.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from bench.benchlib import EXIT_INTERRUPTED, endpoint
from pairctl.cli import argtypes as t
from pairctl.contracts import BENCH_EXITS, exit_line
from pairctl.log import log

EPILOG = exit_line(BENCH_EXITS)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """Endpoint, run protocol, guard, output: the flags common to every serving bench.

    Values are checked here (argtypes), so a bad one stops the run before any request.
    """
    endpoint.add_endpoint_args(p)
    p.add_argument("--runs", type=t.int_at_least(1), default=1, help="measured repeats per point")
    p.add_argument(
        "--warmups", type=t.int_at_least(0), default=1, help="unmeasured requests before measuring"
    )
    p.add_argument(
        "--retries", type=t.int_at_least(0), default=3, help="retries of a contaminated wave"
    )
    p.add_argument(
        "--backoff-s",
        type=t.seconds(0, inclusive=True),
        default=2.0,
        help="first backoff; doubles per retry",
    )
    p.add_argument(
        "--guard-interval-ms",
        type=t.float_above(1.0, inclusive=True),
        default=150,
        help="sampling period (>= 1 ms)",
    )
    p.add_argument(
        "--guard-grace-ms",
        type=t.float_above(0.0, inclusive=True),
        default=500,
        help="how long a finished request of ours still counts as ours (server gauge lag)",
    )
    p.add_argument("--no-guard", action="store_true", help="measure unguarded (not recommended)")
    p.add_argument(
        "--no-abort",
        action="store_true",
        help="let a contaminated wave run to its end instead of cutting it short",
    )
    p.add_argument("--timeout-s", type=t.seconds(0), default=900, help="per-request socket timeout")
    p.add_argument(
        "--settle-ms",
        type=t.float_above(0.0, inclusive=True),
        default=20,
        help="pause between opening connections and sending (server accepts them)",
    )
    p.add_argument("--ready-timeout-s", type=t.seconds(0), default=60, help="wait for /v1/models")
    p.add_argument("--seed", type=int, default=0, help="prompt text seed")
    p.add_argument(
        "--chat-template-kwargs",
        type=t.json_object,
        default=None,
        help="JSON passed as chat_template_kwargs, e.g. '{\"thinking\": false}'",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        type=t.output_file,
        default=None,
        help="write results JSON here (its directory must exist)",
    )
    p.add_argument("--plot", type=t.png_file, default=None, help="write a PNG plot here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def base_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A parser with the shared flags, defaults shown in --help and the exit codes as epilog."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=EPILOG,
    )
    add_cli_args(p)
    return p


def parse(
    argv: argparse.Namespace | list[str] | None,
    doc: str,
    module: str,
    add_own: Callable[[argparse.ArgumentParser], None],
) -> tuple[argparse.Namespace, argparse.ArgumentParser | None]:
    """A bench's flags: ``argv`` parsed with the shared ones and ``add_own`` (``python -m
    MODULE``), or the Namespace ``dspark bench NAME`` parsed already with both. The parser
    comes back for checks that report through ``error`` (None: ``args._parser``)."""
    if isinstance(argv, argparse.Namespace):
        return argv, getattr(argv, "_parser", None)
    p = base_parser(doc.split("\n\n")[0], prog=f"python -m {module}")
    add_own(p)
    return p.parse_args(argv), p


endpoint_of = endpoint.endpoint_of


def entry(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())`` for a script's ``__main__``; a Ctrl-C that lands outside a run
    (while parsing, importing, connecting) is one line and exit 130 too, never a traceback."""
    try:
        code = main()
    except KeyboardInterrupt:
        log("interrupted")
        code = EXIT_INTERRUPTED
    sys.exit(code)
