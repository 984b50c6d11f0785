"""pairctl: the testable logic behind ``launch/dspark_launch.sh``.

The bash launcher only sequences steps; everything that decides something (config
validation, recipe to argv, preflight verdicts, health/phase tracking) lives here so it
can be unit-tested on recorded evidence without a Spark, a docker daemon or ssh.
"""

# Exit codes of launch/dspark_launch.sh (docs/INTERFACES.md); pairctl uses the same.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_BOOT = 4
EXIT_TIMEOUT = 5
EXIT_GATE = 6
EXIT_DEGRADED = 7  # status: something runs, but the pair is not fully healthy
EXIT_DOWN = 8  # status: the endpoint does not answer and no rank's container runs
