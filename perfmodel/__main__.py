"""``python -m perfmodel``: the performance model's command line (perfmodel/cli.py)."""

import sys

from perfmodel.cli import main

if __name__ == "__main__":
    sys.exit(main())
