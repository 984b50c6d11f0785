"""``python -m pairctl``: every command of the launcher (launch/dspark_launch.sh execs it)."""

import sys

from pairctl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
