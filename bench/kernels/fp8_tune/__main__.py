"""``python -m bench.kernels.fp8_tune``: the tuner's command line (``tune.main``).

The guard matters: the parallel compile step spawns worker processes, which re-import this
module as ``__mp_main__`` and must not start a second tuning run.
"""

from __future__ import annotations

import sys

from bench.kernels.fp8_tune.tune import main

if __name__ == "__main__":
    sys.exit(main())
