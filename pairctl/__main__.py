"""``python -m pairctl``: the launcher's Python half (launch/dspark_launch.sh calls it)."""

import sys

from pairctl.cli import main

if __name__ == "__main__":
    sys.exit(main())
