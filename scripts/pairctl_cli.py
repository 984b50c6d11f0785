#!/usr/bin/env python3
"""Entry point for pairctl (the launcher's Python half): ``python3 scripts/pairctl_cli.py``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pairctl.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
