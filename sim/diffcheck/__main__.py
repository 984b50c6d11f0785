"""`python -m sim.diffcheck`: see cli.py."""

from sim.diffcheck.cli import main

raise SystemExit(main())
