"""The post-up quality gate against this pair, with the pair's key and without a proxy.

The gate (``python -m bench.quality_ref_dspark``) reads the bearer token from
OPENAI_API_KEY, so the pair's VLLM_API_KEY travels there through the environment, never on
its command line; NO_PROXY names the endpoint's host so an HTTP(S)_PROXY of the operator's
shell is not put between the gate and the pair (requests honours NO_PROXY).
"""

from __future__ import annotations

import os
import sys

from pairctl.config import PairConfig
from pairctl.lifecycle import endpoint


def gate_env(cfg: PairConfig, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if cfg.VLLM_API_KEY:
        env["OPENAI_API_KEY"] = cfg.VLLM_API_KEY
    hosts = [h for h in (env.get("NO_PROXY") or env.get("no_proxy") or "").split(",") if h]
    env["NO_PROXY"] = env["no_proxy"] = ",".join([*hosts, cfg.SPARK1])
    return env


def run_gate(cfg: PairConfig) -> int:
    """Replace this process with the gate (its exit code is the launcher's to read)."""
    argv = [sys.executable, "-m", "bench.quality_ref_dspark", "--url", endpoint(cfg)]
    sys.stdout.flush()
    os.execvpe(argv[0], argv, gate_env(cfg, dict(os.environ)))
    return 1  # not reached
