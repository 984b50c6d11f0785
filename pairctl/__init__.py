"""pairctl: the control plane of a pair (``python -m pairctl``; ``launch/dspark_launch.sh``
only finds Python and execs it).

Everything that decides something (config validation, recipe to argv, preflight verdicts,
health/phase tracking, the up/down sequence) lives here so it can be unit-tested on
recorded evidence without a Spark, a docker daemon or ssh.
"""

# The exit codes, defined once in pairctl.contracts (docs/INTERFACES.md is generated from it).
from pairctl.contracts import (  # noqa: F401 - re-exported
    EXIT_BOOT,
    EXIT_DEGRADED,
    EXIT_DOWN,
    EXIT_GATE,
    EXIT_INTERRUPTED,
    EXIT_KEY,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_RUNTIME,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
