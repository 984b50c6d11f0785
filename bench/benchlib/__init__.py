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
  proccpu  - CPU seconds of a process tree from /proc (benches that boot their own servers)

From pairctl (the lowest layer, shared with operations): the Endpoint every function here
takes (parsed once from --url), and the argparse types (pairctl.cli.argtypes).
"""

from __future__ import annotations

from pairctl.contracts import BENCH_EXITS, codes

SCHEMA_VERSION = 1

# Exit codes shared by every bench script: pairctl.contracts.BENCH_EXITS has their meanings
# (the --help epilog and docs/INTERFACES.md are generated from it).
_EXIT = codes(BENCH_EXITS)
EXIT_OK = _EXIT["EXIT_OK"]
EXIT_ERROR = _EXIT["EXIT_ERROR"]
EXIT_USAGE = _EXIT["EXIT_USAGE"]
EXIT_CONTAMINATED = _EXIT["EXIT_CONTAMINATED"]
EXIT_INTERRUPTED = _EXIT["EXIT_INTERRUPTED"]

# One stream is one thread and one socket: more than this many at once would measure the
# client box (threads, file descriptors), not the server, whose --max-num-seqs is far lower.
MAX_CONCURRENCY = 512
