"""Shared core of the contamination-guarded benchmarks in bench/.

Modules:
  cli      - the flags every script shares (add_cli_args), stderr logging
  runner   - Bench: run protocol (readiness, test request, warmups), streamed waves, guarded points
  results  - recorded points, exit-code accounting, summary rows (Tally, PointSummary), result JSON
  report   - the printed table and the optional plot
  stream   - the request function: one streamed request -> StreamResult (raw ns timings)
  kstamp   - kernel socket timestamps: connect, departure stamps, the receive loop
  response - StreamResult, and the post-hoc HTTP/chunked/SSE parsing that fills it
  stats    - aggregation of raw timings into TTFT/TPOT/ITL/tok/s (null, never 0, when missing)
  promm    - /metrics scraping (pairctl.status.metrics parses) and counter deltas
  guard    - in-flight tracker, background sampler, guarded wave runner with retries
  prompts  - real-looking filler text calibrated to a token count via /tokenize
  endpoint - pairctl.endpoint under the benches' name: Endpoint, readiness, simulator marks

From pairctl (the lowest layer, shared with operations): the Endpoint every function here
takes (parsed once from --url), and the argparse types (pairctl.cli.argtypes).
"""

from __future__ import annotations

SCHEMA_VERSION = 1

# Exit codes shared by every bench script (documented in bench/README.md).
EXIT_OK = 0
EXIT_ERROR = 1  # endpoint not ready, test request failed, or requests in a wave failed
EXIT_USAGE = 2  # argparse / bad flag values
EXIT_CONTAMINATED = 3  # at least one point had no clean wave after all retries: no number printed
EXIT_INTERRUPTED = 130  # Ctrl-C: one line, the points measured so far written to --json

# One stream is one thread and one socket: more than this many at once would measure the
# client box (threads, file descriptors), not the server, whose --max-num-seqs is far lower.
MAX_CONCURRENCY = 512
