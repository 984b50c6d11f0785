"""``python -m sim.rehearsal``: ``make rehearse`` (sim/rehearsal/rehearse.py)."""

import sys

from sim.rehearsal.rehearse import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
