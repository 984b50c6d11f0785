"""``python -m pairctl.fleet``: the fleet commands (``launch/dspark_launch.sh fleet`` runs it)."""

import sys

from pairctl.fleet.cli import main

if __name__ == "__main__":
    sys.exit(main())
