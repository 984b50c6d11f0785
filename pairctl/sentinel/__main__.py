"""``python -m pairctl.sentinel record [options]``: record the acceptance probe of a pair."""

from __future__ import annotations

import sys

from pairctl.contracts import SENTINEL_EXITS, codes

_EXIT = codes(SENTINEL_EXITS)

USAGE = (
    "usage: python -m pairctl.sentinel record [options]\n"
    "  record   record the acceptance probe on a pair known to be good (record --help)\n"
)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return _EXIT["EXIT_OK"] if argv else _EXIT["EXIT_USAGE"]
    if argv[0] != "record":
        sys.stderr.write(f"unknown command {argv[0]!r}\n" + USAGE)
        return _EXIT["EXIT_USAGE"]
    from pairctl.sentinel.record import main as record_main

    return record_main(argv[1:])


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(_EXIT["EXIT_INTERRUPTED"])
