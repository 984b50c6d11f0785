"""Spark twin: an offline SIMULATOR of a DeepSeek-V4-Flash + DSpark TP=2 pair.

    python -m sim.twin serve MODEL [vllm serve flags] [--twin-profile P]
                                   [--twin-seed N] [--twin-fault SPEC]
    python -m sim.twin truth [--twin-profile P] [vllm serve flags]

`serve` takes `vllm serve`'s command line (unknown flags are logged, not fatal) and serves
the OpenAI endpoints our tools use plus /twin/truth, /twin/requests and /twin/foreign.
`truth` prints the profile's ground truth (what /twin/truth would say) as JSON and exits.
No model runs: timings come from sim/profiles/*.yaml. See docs/simulator.md.
"""

from __future__ import annotations

import json
import sys

from sim.twin import profile as profmod
from sim.twin.app import engine_config, truth
from sim.twin.cli import UsageError, build_parser, parse_serve_args
from sim.twin.faults import Faults
from sim.twin.serve import run


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        if rest and rest[0] in ("-h", "--help"):
            build_parser().print_help()
            return 0
        try:
            return run(rest)
        except KeyboardInterrupt:
            return 130
    if cmd == "truth":
        try:
            args = parse_serve_args(["twin", *rest])
            prof = profmod.load(args.twin_profile)
        except (UsageError, profmod.ProfileError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        cfg = engine_config(args, prof, Faults(), warm=True)
        seed = args.twin_seed if args.twin_seed is not None else args.seed
        print(json.dumps(truth(args, prof, cfg, seed, True, False), indent=2, default=str))
        return 0
    print(f"error: unknown command {cmd!r}; use `serve` or `truth` (see --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
