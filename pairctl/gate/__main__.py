"""``python -m pairctl.gate --url URL``: the quality gate (see pairctl.gate)."""

import sys

from pairctl.gate.cli import main

sys.exit(main())
