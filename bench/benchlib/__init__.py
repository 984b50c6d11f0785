"""Shared core of the contamination-guarded benchmarks in bench/.

Modules:
  stream   - raw-socket streaming request function -> StreamResult (raw ns timings)
  stats    - aggregation of raw timings into TTFT/TPOT/ITL/tok/s (null, never 0, when missing)
  promm    - /metrics scraping (prometheus_client parser) and counter deltas
  guard    - in-flight tracker, background sampler, guarded wave runner with retries
  prompts  - real-looking filler text calibrated to a token count via /tokenize
  cli      - shared flags, run protocol (readiness, test request, warmups), JSON/table/plot output
"""

from __future__ import annotations

SCHEMA_VERSION = 1

# Exit codes shared by every bench script (documented in bench/README.md).
EXIT_OK = 0
EXIT_ERROR = 1  # endpoint not ready, test request failed, or requests in a wave failed
EXIT_USAGE = 2  # argparse / bad flag values
EXIT_CONTAMINATED = 3  # at least one point had no clean wave after all retries: no number printed
