"""Spark twin: an offline simulator of a DeepSeek-V4-Flash + DSpark TP=2 pair.

It is a *simulator*: it runs no model. It speaks the endpoints our launcher, benchmarks and
quality gate use, and times everything with a performance model driven by a profile file
(sim/profiles/). See docs/simulator.md.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

LABEL = "SPARK-TWIN SIMULATOR"
OWNED_BY = "spark-twin-simulator"
HEADER = ("X-Spark-Twin", "simulator")
# Which simulated pair answered (fleet tests route through a real router and need to see
# where a request went). Simulator-only: real vLLM has no such header; the twin sends it
# only when told its pair (`--twin-pair-id` / env TWIN_PAIR_ID).
PAIR_HEADER = "X-Spark-Pair"
PROFILES_DIR = Path(str(files("sim") / "profiles"))  # package data
DEFAULT_PROFILE = PROFILES_DIR / "spark-pair.yaml"
